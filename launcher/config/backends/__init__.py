"""Each backend's part of a job file: its section's model and that section's rules, and what its hosts run
(validate's summary, the Python a script of the user's own gets), one module per backend that has any of
them (launcher.config.backend_table names them)."""
