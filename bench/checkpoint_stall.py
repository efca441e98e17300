"""How long a checkpoint stops training (issue 32): synchronous saves against asynchronous ones
(`checkpoint_async_mode: async`), on one process (CPU, no process group).

The model is a stack of Linear layers trained with AdamW, sized so that its checkpointed state
(fp32 weights and AdamW's two fp32 moments: 12 B per parameter) is about `--gib` GiB. Each mode
trains `--saves` rounds of `--steps` steps and saves after each round; the stall of a save is the
time the training loop spends in Checkpointer.save (for async: waiting for the previous save, if it
is still being written, plus staging the state into host memory). Also printed: the training
steps' time while a background write runs (the write shares the CPU), and how long a background
save takes to be committed (waited for at once after the last save).
Run: `.venv/bin/python bench/checkpoint_stall.py [--gib 1.0] [--saves 3] [--steps 20] [--dir /tmp]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from container.checkpoint.checkpointer import Checkpointer

STATE_BYTES_PER_PARAM = 12  # fp32 weight + AdamW exp_avg + exp_avg_sq
LAYERS = 5
BATCH = 4


def model_of(gib: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = round((gib * 2**30 / STATE_BYTES_PER_PARAM / LAYERS) ** 0.5)
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(LAYERS)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    width = model[0].in_features
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(torch.randn(BATCH, width)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def run(mode: str, gib: float, saves: int, steps: int, base: Path) -> dict:
    model, optimizer = model_of(gib)
    train_steps(model, optimizer, 1)  # AdamW's moments exist from the first step on
    directory = Path(tempfile.mkdtemp(prefix=f"stall-{mode}-", dir=base))
    checkpointer = Checkpointer(directory, keep=2, async_mode=mode)
    stalls, step_times = [], []
    try:
        for save in range(1, saves + 1):
            step_times += train_steps(model, optimizer, steps)
            start = time.perf_counter()
            checkpointer.save(save, model, optimizer, None, {})
            stalls.append(time.perf_counter() - start)
        start = time.perf_counter()
        checkpointer.close()
        commit = time.perf_counter() - start
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    state = sum(p.numel() for p in model.parameters()) * STATE_BYTES_PER_PARAM / 2**30
    return {"state_gib": state, "stall": statistics.median(stalls), "stalls": stalls,
            "step": statistics.median(step_times), "last_commit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="checkpointed state, GiB")
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="training steps between saves")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where checkpoints go")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    torch.set_num_threads(1)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, checkpoints in {args.dir}, "
          f"{args.saves} saves, {args.steps} steps apart, 1 compute thread")
    sync = run("disabled", args.gib, args.saves, args.steps, args.dir)
    background = run("async", args.gib, args.saves, args.steps, args.dir)
    print(f"checkpointed state: {sync['state_gib']:.2f} GiB (fp32 weights + AdamW moments)")
    print("| mode | stall per save (median) | each save | training step (median of all) | last save committed after |")
    print("|---|---|---|---|---|")
    for name, r in (("disabled (sync)", sync), ("async", background)):
        each = ", ".join(f"{s:.2f}" for s in r["stalls"])
        print(f"| {name} | {r['stall']:.2f} s | {each} s | {r['step'] * 1000:.0f} ms | {r['last_commit']:.2f} s |")
    print(f"async stall / sync stall: {background['stall'] / sync['stall']:.3f}; "
          f"median training step, async run / sync run: {background['step'] / sync['step']:.2f}")


if __name__ == "__main__":
    main()
