"""A train.py rank (tests/support/train_runs) whose second optimizer step runs under the trace's own
collective counter (container.trace.collectives), so a real gloo run's collectives can be compared
with what `plan --trace` counts in its traced step (also the second: the first is its warm-up).
Each rank writes its rows to `collectives-rank<r>.json` in the run's rank-log directory."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import train_runs

COUNTED_STEP = 2


def counted_rank(local_rank: int, argv: list[str], env: dict[str, str], cwd: str, logs: str) -> None:
    from container import loop
    from container.trace.collectives import CollectiveCounter, group_names

    real, calls = loop.train_step, []

    def train_step(rt, *args, **kwargs):
        calls.append(None)
        if len(calls) != COUNTED_STEP:
            return real(rt, *args, **kwargs)
        with CollectiveCounter(group_names(rt)) as counter:
            out = real(rt, *args, **kwargs)
        (Path(logs) / f"collectives-rank{local_rank}.json").write_text(json.dumps(counter.rows()))
        return out

    loop.train_step = train_step  # run_steps looks it up in the module at each step
    train_runs._rank(local_rank, argv, env, cwd, logs)
