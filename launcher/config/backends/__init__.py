"""Each backend's part of a job file: its section's model and that section's rules, one module per
backend that has a section (launcher.config.backend_table lists them)."""
