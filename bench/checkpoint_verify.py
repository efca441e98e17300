"""What verified checkpoints cost (issue 12): a save with its manifest against DCP's save alone,
and the sha256 verification a resume runs, on one process (CPU, no process group).

The model is a stack of Linear layers of about `--gib` GiB of fp32 weights, with SGD (no
optimizer state), so the checkpoint is the weights. Each figure is the median of `--repeats`.
Run: `.venv/bin/python bench/checkpoint_verify.py [--gib 1.0] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from container.checkpoint import manifest
from container.checkpoint.checkpointer import Checkpointer, _sharded_state

WIDTH = 4096


def model_of(gib: float) -> nn.Module:
    layers = max(1, round(gib * 2**30 / (WIDTH * WIDTH * 4)))
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process on purpose
    model = model_of(args.gib)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plain, verified, verify = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(args.repeats):
            target = root / f"plain-{i}"
            plain.append(timed(dcp.save, _sharded_state(model, optimizer), checkpoint_id=target, no_dist=True))
            shutil.rmtree(target)
            saver = Checkpointer(root / f"verified-{i}", keep=1, rank=0, local_rank=0)
            verified.append(timed(saver.save, 1, model, optimizer, None, {}))
            path = saver.path(1)
            entries, reason = manifest.inspect(path, 1, required=())
            assert reason is None, reason
            verify.append(timed(manifest.first_mismatch, path, entries))
            size = sum(e.size for e in entries) / 2**30
            shutil.rmtree(root / f"verified-{i}")
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"checkpoint: {size:.2f} GiB on {tempfile.gettempdir()}")
    p, v, h = (statistics.median(x) for x in (plain, verified, verify))
    print(f"dcp.save alone:              {p:6.2f} s")
    print(f"Checkpointer.save (manifest): {v:6.2f} s  ({v / p:.2f} x dcp.save)")
    print(f"resume verification (sha256): {h:6.2f} s  ({size / h:.2f} GiB/s on one rank)")


if __name__ == "__main__":
    main()
