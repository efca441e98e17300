"""Slurm: the batch script, the scheduler's commands, and the runner that starts one bootstrap per node.

The backend itself is launcher.backends.slurm; docs/slurm.md describes how a job runs.
"""
