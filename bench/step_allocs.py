"""Tensor allocations per training step of entrypoints/train.py's loop (container/loop.py), counted on CPU.

Every op's output that does not share storage with one of its inputs is a new allocation (a view
or an in-place op allocates nothing); its storage's bytes are counted with it. This runs train.py's
`main` in this process (a world of one, gloo) under a dispatch mode that counts them step by step
(a step ends at the step watchdog's `step_done`), by phase: the model's forward and backward
(`forward_backward`, or the pipeline's schedule), gradient clipping, the optimizer's update, and the
rest of the loop (the batch, the loss's all-reduce and division, the non-finite guard, records).
At each step's end it also sums the bytes of every tensor still alive: a figure that grows step by
step is a leak.

On a GPU the caching allocator serves these from its pool (no cudaMalloc after the first steps),
so a count is launch and bookkeeping overhead, not memory traffic; what this shows is which part
of the loop allocates per step and whether the loop keeps anything from one step to the next.

    .venv/bin/python bench/step_allocs.py [--max_steps 8] [--optimizer_implementation fused] [KEY VALUE ...]

prints one JSON object, on its last line:
{"steps": {step: {phase: [tensors, bytes], ...,"live_bytes": n}}, "loop_sites": {site: tensors}}.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "entrypoints"))
from bench import in_process  # noqa: E402 - after the path it is found on

# (phase, a frame's file:function that puts an op in it), innermost match first
PHASES = (("optimizer", ("optim.py:step", "adamw.py:", "optimizer.py:")),
          ("clip", ("optim.py:clip_grad_norm_",)),
          ("forward_backward", ("loop.py:forward_backward", "pipeline.py:step")))


class CountAllocations(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.step = 1
        self.phases = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))
        self.loop_sites = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and _has_storage(t)}
        fresh = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tree_leaves(out)
                 if isinstance(t, torch.Tensor) and _has_storage(t) and t.untyped_storage().data_ptr() not in inputs}
        if fresh:
            phase, site = _phase()
            counts = self.phases[self.step][phase]
            counts[0] += len(fresh)
            counts[1] += sum(fresh.values())
            if phase == "loop":
                self.loop_sites[site] += len(fresh)
        return out


def _has_storage(t: torch.Tensor) -> bool:
    try:
        return t.untyped_storage().data_ptr() != 0
    except (RuntimeError, NotImplementedError):  # a meta tensor or a subclass without one
        return False


def _phase() -> tuple[str, str]:
    """The op's phase, from the stack; for the loop's own ops, its innermost frame in smlaunch's runtime."""
    stack = traceback.extract_stack()[:-2]
    frames = [f"{Path(f.filename).name}:{f.name}" for f in stack]
    for phase, marks in PHASES:
        if any(frame.startswith(mark) for frame in frames for mark in marks):
            return phase, ""
    for frame in reversed(stack):
        path = frame.filename.replace("\\", "/")
        if "/container/" in path:
            return "loop", f"{path.rpartition('/container/')[2]}:{frame.name}:{frame.lineno}"
    return "loop", "other"


def live_bytes() -> int:
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and _has_storage(obj):
            ptr = obj.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += obj.untyped_storage().nbytes()
    return total


def count(argv: list[str]) -> dict:
    pairs = in_process.settings(argv)
    counter = CountAllocations()
    live = {}

    def step_end(step: int) -> None:
        with torch._C._DisableTorchDispatch():  # reading the live tensors allocates nothing to count
            live[step] = live_bytes()
        counter.step = step + 1

    in_process.run_train(pairs, counter, step_end)
    steps = range(1, int(pairs["max_steps"]) + 1)
    return {"steps": {s: {**{p: list(c) for p, c in sorted(counter.phases[s].items())}, "live_bytes": live.get(s)}
                      for s in steps},
            "loop_sites": dict(counter.loop_sites.most_common())}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(count(sys.argv[1:])))  # one line, the last: train.py prints its records before it
