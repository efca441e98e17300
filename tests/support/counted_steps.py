"""A train.py rank (tests/support/train_runs) whose second optimizer step runs under the trace's own
collective counter (container.trace.collectives), so a real gloo run's collectives can be compared
with what `plan --trace` counts in its traced step (also the second: the first is its warm-up),
its MoE tokens routed evenly as the trace routes them.
Each rank writes its rows to `collectives-rank<r>.json` in the run's rank-log directory. And the
trace of every rank of a world, each rank a process forked from the fork server (the trace is
process-wide; a fresh `python -m container trace` would import torch again for each rank)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch.multiprocessing as mp

from tests.support import forkserver, train_runs

COUNTED_STEP = 2


def counted_rank(local_rank: int, argv: list[str], env: dict[str, str], cwd: str, logs: str) -> None:
    from container import loop
    from container.models.moe import routed_by
    from container.trace.collectives import CollectiveCounter, group_names
    from container.trace.routing import EvenRouting

    real, calls = loop.train_step, []

    def train_step(rt, *args, **kwargs):
        calls.append(None)
        if len(calls) != COUNTED_STEP:
            return real(rt, *args, **kwargs)
        with CollectiveCounter(group_names(rt)) as counter, routed_by(EvenRouting()):  # the trace's routing
            out = real(rt, *args, **kwargs)
        (Path(logs) / f"collectives-rank{local_rank}.json").write_text(json.dumps(counter.rows()))
        return out

    loop.train_step = train_step  # run_steps looks it up in the module at each step
    train_runs._rank(local_rank, argv, env, cwd, logs)


def trace_world(requests: list[str], out: Path) -> dict[int, dict]:
    """Each TraceRequest (as JSON) traced by container.trace.step.trace_rank in a process of its own."""
    mp.start_processes(_trace, args=(requests, str(out)), nprocs=len(requests), join=True,
                       start_method=forkserver.start_method())
    return {i: json.loads((out / f"trace-{i}.json").read_text()) for i in range(len(requests))}


def _trace(index: int, requests: list[str], out: str) -> None:
    import torch

    from container.trace.step import trace_rank
    from launcher.wire.trace_record import TraceRequest

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    result = trace_rank(TraceRequest.from_json(requests[index]))
    (Path(out) / f"trace-{index}.json").write_text(json.dumps(result))
