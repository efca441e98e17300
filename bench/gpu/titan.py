"""torchtitan 0.3.0 as the second peer: its own Trainer (torchtitan.trainer) built from the config in
bench/gpu/titan_config.py, one rank, the same shape, sequence length, tokens per step and synthetic
rows as the other stacks; run by bench/gpu/titan_run.py in its own process.

What it needs that the GPU machine lacks comes as wheels (bench/gpu/prepare.sh). Where it cannot
run (not installed, a requirement missing, a torch it does not support), the run is recorded as
skipped with that reason and the Hugging Face loop stays the peer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bench.gpu.measure import Outcome
from bench.gpu.peers import run_worker
from bench.gpu.table import Run

# Imported on torchtitan's training path (its METADATA's Requires-Dist less what the path never
# imports: datasets, wandb and tensorboard only for its own data sets and trackers, which the bench
# config does not use).
REQUIRED = ("torchtitan", "tyro", "torchdata", "spmd_types", "einops", "safetensors")


def missing() -> list[str]:
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def run_torchtitan(run: Run, timeout_s: float, scratch: Path) -> Outcome:
    absent = missing()
    if absent:
        return Outcome.skipped(f"torchtitan cannot run here: {', '.join(absent)} not installed "
                               "(bench/gpu/prepare.sh brings the wheels)")
    return run_worker("bench.gpu.titan_run", run, timeout_s, env={"DUMP_FOLDER": str(scratch / run.name)})
