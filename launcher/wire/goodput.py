"""Goodput measured: the share of a job's wall time that trained, and where the rest went
(docs/faults.md, "Goodput").

Rank 0 of smlaunch's runtime puts its time ledger into every metrics record
(container/resilience/ledger.py; the fields are launcher.wire.metric_lines'): the attempt, the step
it started from, when its loop began, and the seconds its loop has spent so far in steps, in waiting
for batches, in checkpoint saves and in validation. With the job's start and end and the bootstrap's
restart records (launcher.wire.faults), the job's wall time splits into:

- productive: the time of the steps that count, each step once;
- start-up: from the job's start to its first loop (failed attempts before any loop included);
- restarts: from a failure to training again, and a failed attempt's loop time its ledger does not
  account for (the failure's detection: a hang's timeout);
- replayed: the steps a failed attempt ran after the checkpoint the next one resumed from;
- checkpoints, input waits, validation: what the ledgers say;
- other: the rest (logging, the model's export at the end, processes ending).

A step's time is its attempt's mean step time: the ledger is read at logged steps only. No torch:
the container writes the fields and the launcher reads them with this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from launcher.wire.faults import Restart, read_restarts
from launcher.wire.metric_lines import (
    ATTEMPT,
    CHECKPOINT,
    DATA,
    LOOP_START,
    START_STEP,
    STEPS,
    TIME_FIELDS,
    VALIDATION,
    read_records,
)

# Where the time that did not train went, in the order `text` names them.
LOST = ("start-up", "restarts", "replayed", "checkpoints", "input waits", "validation", "other")


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    productive_s: float
    lost_s: dict[str, float]  # seconds per LOST entry

    @property
    def fraction(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def text(self) -> str:
        """'goodput 87% (start-up 3%, restarts 6%, replayed 2%, checkpoints 2%)': parts under 0.5% left out."""
        parts = [f"{name} {share:.0%}" for name in LOST
                 if (share := self.lost_s[name] / self.wall_s if self.wall_s > 0 else 0.0) >= 0.005]
        return f"goodput {self.fraction:.0%}" + (f" ({', '.join(parts)})" if parts else "")

    def to_dict(self) -> dict:
        return {"goodput": round(self.fraction, 4), "wall_s": round(self.wall_s, 3),
                "productive_s": round(self.productive_s, 3),
                "lost_s": {name: round(self.lost_s[name], 3) for name in LOST}}


@dataclass(frozen=True)
class _Attempt:
    number: int
    start_step: int
    loop_start: datetime
    last: Mapping  # its record of the highest step

    @property
    def step(self) -> int:
        return int(self.last["step"])

    def seconds(self, category: str) -> float:
        return float(self.last[TIME_FIELDS[category]])

    @property
    def step_s(self) -> float:
        """The mean time of this attempt's steps."""
        done = self.step - self.start_step
        return self.seconds(STEPS) / done if done > 0 else 0.0


def goodput(started: datetime, ended: datetime, restarts: Sequence[Restart],
            records: Iterable[Mapping]) -> Goodput | None:
    """The job's goodput from its start and end (aware datetimes), its restart records and its
    metrics records; None when no record carries the ledger (a script of the user's own, or a job
    before its first logged step)."""
    attempts = _attempts(records)
    if not attempts:
        return None
    failures = _failures(restarts)
    lost = dict.fromkeys(LOST, 0.0)
    productive = 0.0
    lost["start-up"] = _seconds(started, attempts[0].loop_start)
    for current, following in zip(attempts, [*attempts[1:], None]):
        failure = failures.get(current.number)
        # the failure record knows the last completed step; the ledger, the last logged one
        end = max(current.step, failure.step) if failure and failure.step is not None else current.step
        resume = following.start_step if following else end
        productive += max(min(end, resume) - current.start_step, 0) * current.step_s
        replayed = max(end - resume, 0) * current.step_s
        lost["replayed"] += replayed
        spent = {name: current.seconds(category) for name, category in
                 (("checkpoints", CHECKPOINT), ("input waits", DATA), ("validation", VALIDATION))}
        for name, seconds in spent.items():
            lost[name] += seconds
        if failure is not None and following is not None:
            failed_at = _time(failure.at)
            accounted = (end - current.start_step) * current.step_s + sum(spent.values())
            lost["restarts"] += max(_seconds(current.loop_start, failed_at) - accounted, 0.0)
            lost["restarts"] += _seconds(failed_at, following.loop_start)
    wall = _seconds(started, ended)
    lost["other"] = max(wall - productive - sum(lost.values()), 0.0)
    return Goodput(wall, productive, lost)


def measure(output_data_dirs: Sequence[Path], started: datetime, ended: datetime | None = None) -> Goodput | None:
    """The goodput of a job from its output data directories (one per host: rank 0's holds the
    metrics, every host's bootstrap writes its restart records, and a local or Slurm supervisor its
    record of a lost host); `ended` None: now (a running job). A damaged metrics file is
    DamagedMetrics (launcher.wire.metric_lines): a goodput without some of its records would be wrong."""
    records, restarts = [], []
    for directory in output_data_dirs:
        records += read_records(Path(directory))
        restarts += read_restarts(Path(directory))
    return goodput(started, ended or datetime.now(timezone.utc), restarts, records)


def _attempts(records: Iterable[Mapping]) -> list[_Attempt]:
    """Each attempt's last ledger record, in attempt order."""
    last: dict[int, Mapping] = {}
    for record in records:
        numbers = ("step", ATTEMPT, START_STEP, *TIME_FIELDS.values())
        if not isinstance(record.get(LOOP_START), str) or not all(
                isinstance(record.get(k), (int, float)) for k in numbers):
            continue
        number = int(record[ATTEMPT])
        if number not in last or record["step"] >= last[number]["step"]:
            last[number] = record
    return [_Attempt(n, int(r[START_STEP]), _time(r[LOOP_START]), r) for n, r in sorted(last.items())]


def _failures(restarts: Sequence[Restart]) -> dict[int, Restart]:
    """One failure per attempt: the earliest any host reported (every host's bootstrap may write one)."""
    out: dict[int, Restart] = {}
    for record in restarts:
        if record.attempt not in out or _time(record.at) < _time(out[record.attempt].at):
            out[record.attempt] = record
    return out


def _time(value: str | datetime) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _seconds(start: datetime, end: datetime) -> float:
    return max((_time(end) - _time(start)).total_seconds(), 0.0)

