"""Host syncs per training step of entrypoints/train.py's loop (container/loop.py), counted on CPU.

A host sync is a read of a tensor's value into Python (`.item()`, `float(t)`, `bool(t)`, `.tolist()`):
every one is `aten::_local_scalar_dense`, which on a GPU waits for every kernel queued before it.
This runs train.py's `main` in this process (a world of one, gloo) under a dispatch mode that counts
those reads, step by step (a step ends at the step watchdog's `step_done`), and where in the
runtime's code each comes from. Reads of CPU tensors (the loader's, the batches' document lengths)
are counted too: on a GPU they wait for nothing, so `device_reads` leaves out what the data loader
and `attended_length` read before the batch moves to the device.

    .venv/bin/python bench/step_syncs.py --logging_freq 4 --max_steps 8 [KEY VALUE ...]

prints one JSON object, on its last line:
{"steps": {step: {"reads": n, "device_reads": n, "logged": bool}}, "sites": {...}}.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "entrypoints"))
from bench import in_process  # noqa: E402 - after the path it is found on

# reads of tensors that stay on the host on a GPU too, and so wait for nothing there: the batch before
# it moves to the device, and the step counters foreach and for-loop AdamW keep on the CPU
HOST_SIDE = ("data/", "run_data.py", "attended_length", "_get_value")

class CountReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.step, self.reads, self.sites = 1, collections.Counter(), collections.Counter()
        self.device_reads = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            site = _site()
            self.reads[self.step] += 1
            self.sites[site] += 1
            if not any(part in site for part in HOST_SIDE):
                self.device_reads[self.step] += 1
        return func(*args, **(kwargs or {}))


def _site() -> str:
    """The innermost frame of smlaunch's runtime that asked for the value, and torch's function
    under it that read it, if any ("loop.py:train_step > adamw.py:_multi_tensor_adamw")."""
    stack = [f for f in traceback.extract_stack()[:-1]
             if not any(part in f.filename for part in ("_python_dispatch", "/_dynamo/", "torch/_compile.py"))]
    inner = ""
    for frame in reversed(stack):
        path = frame.filename.replace("\\", "/")
        if "/container/" in path:
            return f"{path.rpartition('/container/')[2]}:{frame.name}" + (f" > {inner}" if inner else "")
        if not inner and "/torch/" in path:
            inner = f"{path.rpartition('/')[2]}:{frame.name}"
    return "other"


def count(argv: list[str]) -> dict:
    pairs = in_process.settings(argv)
    logged = {step for step in range(1, int(pairs["max_steps"]) + 1)
              if step % int(pairs["logging_freq"]) == 0 or step == int(pairs["max_steps"])}
    counter = CountReads()

    def step_end(step: int) -> None:
        counter.step = step + 1

    in_process.run_train(pairs, counter, step_end)
    steps = range(1, int(pairs["max_steps"]) + 1)
    return {"steps": {s: {"reads": counter.reads[s], "device_reads": counter.device_reads[s], "logged": s in logged}
                      for s in steps},
            "sites": dict(counter.sites.most_common())}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(count(sys.argv[1:])))  # one line, the last: train.py prints its records before it
