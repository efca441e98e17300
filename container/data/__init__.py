"""Training data: packing text into token blocks (pack), reading them in a global order (loader)."""
