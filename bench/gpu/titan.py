"""torchtitan 0.3.0 as the second peer: its own Trainer (torchtitan.trainer) built from the config in
bench/gpu/titan_config.py, one rank, the same shape, sequence length, tokens per step and synthetic
rows as the other stacks; run by bench/gpu/titan_run.py in its own process.

Where it cannot run (a torch it does not support, not installed, a requirement missing), the run
is recorded as skipped with that reason and the Hugging Face loop stays the peer. On the GPU
machine's torch 2.11 it cannot (`torch_too_old`, found on CPU with torch 2.11.0 and its wheels), so
bench/gpu/prepare.sh does not carry it; with a torch that has the API, install torchtitan==0.3.0
with tyro, docstring-parser, typeguard, torchdata and spmd-types==0.2.3 and the runs take place.
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


# torchtitan 0.3.0's FSDP code (torchtitan/distributed/fsdp.py, 20 uses) imports this from torch; torch
# 2.11 (the GPU machine's) has no such name, 2.13 has: seen on CPU with torch 2.11.0 and the wheels.
TORCH_API = ("torch.distributed.fsdp", "DataParallelMeshDims")


def missing() -> list[str]:
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def torch_too_old() -> str | None:
    """Why this torch cannot run torchtitan 0.3.0, or None."""
    import importlib

    import torch

    module, name = TORCH_API
    if hasattr(importlib.import_module(module), name):
        return None
    return (f"torchtitan 0.3.0 cannot run on torch {torch.__version__}: it imports {module}.{name}, which this "
            "torch lacks (torch 2.13 has it; torchtitan pins a newer torch than the GPU machine's 2.11); "
            "the Hugging Face loop is the peer")


def run_torchtitan(run: Run, timeout_s: float | None, scratch: Path) -> Outcome:
    too_old = torch_too_old()
    if too_old:
        return Outcome.skipped(too_old)
    absent = missing()
    if absent:
        return Outcome.skipped(f"torchtitan cannot run here: {', '.join(absent)} not installed "
                               "(bench/gpu/prepare.sh brings the wheels)")
    return run_worker("bench.gpu.titan_run", run, timeout_s, env={"DUMP_FOLDER": str(scratch / run.name)})
