"""Hyperparameter sweeps run here or on Slurm (docs/tuning.md): trials as ordinary local or Slurm jobs,
chosen by a strategy (`strategies`), scored from their metrics (`objective`), stopped early by the
median rule (`median`), recorded in the sweep's state file (`state`), driven by `sweep`."""
