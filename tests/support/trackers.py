"""Reading a tracker's run back as its own tools do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def wandb_records(wandb_dir: Path) -> list[dict]:
    """The records of the one offline W&B run under `wandb_dir` (WANDB_DIR), read with W&B's own
    reader, `wandb leet inspect --json`: run, history, exit, preempting, ..."""
    runs = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs  # rank 0 only
    out = subprocess.run([str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--json", str(runs[0])],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]
