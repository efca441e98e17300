"""This attempt's progress, as the bootstrap needs it to classify a failure (launcher.wire.faults).

The trainer says where the loop started and each step it completes; a rank that fails writes
that with its exception (`record_failure`, from `container.distributed.runtime.run_rank`), so the
bootstrap can tell an error before any progress (a job error, never retried) from one after it.
"""

from __future__ import annotations

import os
from pathlib import Path

from launcher.wire.faults import (
    AttemptStart,
    RankFailure,
    append_attempt_start,
    attempt,
    read_restarts,
    write_rank_failure,
)
from launcher.wire.metric_lines import now

_state: dict[str, int | None] = {"start_step": None, "step": None, "restarts": None}


def started(start_step: int, output_data: Path | None) -> None:
    """The loop begins after `start_step` (0, or the checkpoint it resumed); rank 0 (the one given
    `output_data`) records it for the launcher (launcher.wire.faults.AttemptStart)."""
    _state.update(start_step=start_step, step=start_step)
    if output_data is not None:
        append_attempt_start(output_data, AttemptStart(attempt(), start_step, now()))


def restart_event(output_data: Path, start_step: int) -> dict | None:
    """The record that tells the trackers (and metrics.jsonl) that this attempt is a restart: at
    the step it resumed from, the job's restarts so far and the last one's reason, as this host's
    bootstrap recorded it (launcher.wire.faults); None for a job's first attempt."""
    restarted = [r for r in read_restarts(output_data) if r.restarted]
    if not attempt() or not restarted:
        return None
    _state["restarts"] = len(restarted)
    return {"step": start_step, "restarts": len(restarted), "restart_reason": restarted[-1].text()}


def fields() -> dict:
    """What each training record of a restarted attempt carries: the job's restarts so far, so
    every tracker has a `train/restarts` series (a continued run drops the replayed steps'
    records, the resume step's event with them: the series steps up at the first new step)."""
    return {"restarts": _state["restarts"]} if _state.get("restarts") else {}


def completed(step: int) -> None:
    _state["step"] = step


def last_step() -> int | None:
    return _state["step"]


def record_failure(exc: BaseException, in_collective: bool) -> None:
    first_line = (str(exc).strip().splitlines() or [""])[0][:500]
    write_rank_failure(RankFailure(
        rank=int(os.environ.get("RANK", "0")), exception=type(exc).__name__, message=first_line,
        step=_state["step"], start_step=_state["start_step"], collective=in_collective,
        bases=tuple(c.__name__ for c in type(exc).__mro__)))
