"""Reading a tracker's run back as its own tools do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def wandb_records(wandb_dir: Path) -> list[dict]:
    """The records of the one offline W&B run under `wandb_dir` (WANDB_DIR), read with W&B's own
    reader, `wandb leet inspect --json`: run, history, exit, preempting, ..."""
    runs = wandb_runs(wandb_dir)
    assert len(runs) == 1, len(runs)  # rank 0 only
    return runs[0]


def wandb_runs(wandb_dir: Path) -> list[list[dict]]:
    """The records of each offline W&B run (each start of one) under `wandb_dir`, oldest first."""
    wandb = str(Path(sys.executable).with_name("wandb"))
    return [[json.loads(line) for line in subprocess.run([wandb, "leet", "inspect", "--json", str(run)],
                                                         capture_output=True, text=True, timeout=120,
                                                         check=True).stdout.splitlines()]
            for run in sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))]
