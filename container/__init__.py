"""smlaunch's container side: what runs inside the training container (torch lives here)."""
