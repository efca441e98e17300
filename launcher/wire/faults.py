"""What the bootstrap, the runtime and the launcher agree on about faults and restarts (docs/faults.md).

- The job's restart budget reaches the container as `SMLAUNCH_MAX_RESTARTS` (the job field
  `max_restarts`), and each attempt's number as `SMLAUNCH_ATTEMPT` (0 for the first run).
- A rank of smlaunch's runtime that fails leaves a failure record (`rank-<rank>.json`) in
  `SMLAUNCH_FAULT_DIR`, so the bootstrap can classify the failure: its exception, the last step
  it completed in this attempt and the step it started from.
- Rank 0 of smlaunch's runtime appends one line per attempt to `attempts.jsonl` (the step its
  loop began from and when), so the launcher knows the steps a restart replayed.
- The bootstrap appends one line per restart (and one for the failure that ended the job) to
  `restarts.jsonl` in the output data directory, where the local supervisor, `status` and
  output.tar.gz read it, and logs the same record (`restart_line`), where `status` of a running
  SageMaker job reads it.
- Exit codes the runtime leaves with on purpose: a hung step (`EXIT_HUNG`) and a non-finite loss
  the job asked to roll back (`EXIT_NONFINITE_ROLLBACK`).
- Fault injection, for tests only (`SMLAUNCH_FAULT_INJECTION`): the value must begin with
  `ARMING`, so no ordinary setting can trigger it by accident.

No torch here: the container writes with this module and the launcher reads with it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

MAX_RESTARTS_ENV = "SMLAUNCH_MAX_RESTARTS"
MAX_RESTARTS = 100  # a job's restarts in all, whatever its rules ask (launcher.wire.restart_policy)
ATTEMPT_ENV = "SMLAUNCH_ATTEMPT"
FAULT_DIR_ENV = "SMLAUNCH_FAULT_DIR"
HANG_TIMEOUT_ENV = "SMLAUNCH_HANG_TIMEOUT"  # the job's hang_timeout: a script of its own silent this long is hung
RESTARTS_FILE = "restarts.jsonl"
ATTEMPTS_FILE = "attempts.jsonl"  # rank 0: where each attempt's training loop began
DIAGNOSTICS_DIR = "diagnostics"  # in the output data directory: stacks and logs of a hang

EXIT_HUNG = 86  # a rank's step watchdog found no progress within the step timeout
HUNG_EXCEPTION = "StepTimeout"  # what that rank's failure record names (container.resilience.step_watch)
EXIT_NONFINITE_ROLLBACK = 87  # a non-finite loss under nonfinite_policy=rollback

# Failure classes: what the bootstrap does with a failure.
FAULT = "fault"  # restarted while restarts remain: a signal, a hang, a lost host, a peer's failure
JOB_ERROR = "job error"  # never restarted: the job's configuration, code or data is wrong
REPEATED = "repeated"  # a fault that came back at the same place without progress: stop
REPEATED_WHY = "the same failure as the attempt before, with no step completed beyond it"
HOST_LOST = "host lost"  # the detail of a lost host's record (the local or Slurm supervisor's)
_ANYWHERE = ("hung", "frozen", "collective")  # a hang or a peer's failure may end on any rank first

FAULT_ENV = "SMLAUNCH_FAULT_INJECTION"
ARMING = "test-only, kills this job:"
FAULT_KINDS = ("exit", "signal", "hang", "stop", "nonfinite", "host", "host-gone")
HOST_GONE = "host-gone"  # the kind, and the file in the host's /opt/ml tree that says it cannot come back


def attempt() -> int:
    """This attempt's number (0: the job's first run; 1 after the first restart)."""
    try:
        return max(int(os.environ.get(ATTEMPT_ENV, "0")), 0)
    except ValueError:
        return 0


# --- failure records (rank -> bootstrap) ------------------------------------------------------

@dataclass(frozen=True)
class RankFailure:
    rank: int
    exception: str  # the exception's type name
    message: str  # its first line
    step: int | None  # the last step completed in this attempt (None: before the loop began)
    start_step: int | None  # the step this attempt started from (0, or the checkpoint's)
    collective: bool = False  # raised by a collective (a peer failed or stopped answering)
    bases: tuple[str, ...] = ()  # the names of the exception's classes, its own first (its __mro__)

    @property
    def progressed(self) -> bool:
        return self.step is not None and self.start_step is not None and self.step > self.start_step


def write_rank_failure(failure: RankFailure) -> None:
    """Into SMLAUNCH_FAULT_DIR, when the bootstrap set it (else nowhere: torchrun alone)."""
    directory = os.environ.get(FAULT_DIR_ENV)
    if not directory:
        return
    path = Path(directory) / f"rank-{failure.rank}.json"
    try:
        path.write_text(json.dumps(asdict(failure)), encoding="utf-8")
    except OSError:  # the failure itself is reported on stderr; this record only classifies it
        pass


def read_rank_failures(directory: Path) -> dict[int, RankFailure]:
    out = {}
    for path in sorted(Path(directory).glob("rank-*.json")):
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
            values["bases"] = tuple(values.get("bases", ()))
            out[int(values["rank"])] = RankFailure(**values)
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return out


# --- restart records (bootstrap -> launcher) ---------------------------------------------------

@dataclass(frozen=True)
class Restart:
    """One failure the bootstrap saw, and what it did: `restarted` true for a restart."""
    attempt: int  # the attempt that failed
    at: str  # when it failed (ISO 8601, UTC)
    failure_class: str  # FAULT, JOB_ERROR or REPEATED
    reason: str  # the failure's first line: rank, host, how it ended
    host: str
    restarted: bool
    rank: int | None = None
    step: int | None = None  # the last step completed before the failure (None: unknown)
    resumed_from: int | None = None  # the step the failed attempt had started from
    detail: str = ""  # the exception or signal
    seconds: float | None = None  # the failed attempt's wall time
    extra: dict = field(default_factory=dict)

    def text(self) -> str:
        what = "restarted" if self.restarted else "not restarted"
        step = f" at step {self.step}" if self.step is not None else ""
        return f"attempt {self.attempt} failed{step} ({self.failure_class}, {what}): {self.reason}"


def repeats(previous: list[Restart], detail: str, step: int | None, rank: int | None = None,
            host: str | None = None) -> bool:
    """The repeat rule (docs/faults.md): a failure of cause `detail` is the attempt before's come back
    when that attempt failed of the same cause at the same place (the same rank; for a lost host, the
    same host; a hang's or a peer's failure anywhere) and no step was completed beyond it (`step`,
    the last one completed; where either step is unknown, twice alike is a repeat)."""
    if not previous or previous[-1].detail != detail:
        return False
    last = previous[-1]
    if not (last.host == host if detail == HOST_LOST else detail in _ANYWHERE or last.rank == rank):
        return False
    return step is None or last.step is None or step <= last.step


def gave_up(why: str, earlier: list[Restart]) -> str:
    """What the report of a failure that a job with restarts does not restart adds to its first line:
    `why`, and every `earlier` failure of the job, so that its FailureReason has all of its reasons."""
    before = "; ".join(r.text() for r in earlier)
    return f"; {why}" + (f"; earlier failures: {before}" if before else "")


def append_restart(output_data: Path, record: Restart) -> None:
    _append(output_data / RESTARTS_FILE, record)


RESTART_LINE = "smlaunch-restart-record"  # one word, which CloudWatch's filter patterns match quoted


def restart_line(record: Restart) -> str:
    """The record as one log line."""
    return f"{RESTART_LINE} {json.dumps(asdict(record))}"


def from_restart_line(message: str) -> Restart | None:
    """The record of a log line that holds one (after whatever prefix the log gave it), else None."""
    _, marker, rest = message.partition(f"{RESTART_LINE} ")
    if not marker:
        return None
    try:
        return Restart(**json.loads(rest))
    except (ValueError, TypeError):
        return None


def read_restarts(output_data: Path) -> list[Restart]:
    """The records of `output_data`, oldest first; lines that are not records are skipped."""
    return _read(Path(output_data) / RESTARTS_FILE, Restart)


# --- attempt starts (rank 0 -> launcher) -------------------------------------------------------

@dataclass(frozen=True)
class AttemptStart:
    attempt: int
    start_step: int  # the step it resumed from (0: from the start)
    at: str  # when its loop began (ISO 8601, UTC)


def append_attempt_start(output_data: Path, record: AttemptStart) -> None:
    _append(output_data / ATTEMPTS_FILE, record)


def read_attempt_starts(output_data: Path) -> list[AttemptStart]:
    return _read(Path(output_data) / ATTEMPTS_FILE, AttemptStart)


def _append(path: Path, record) -> None:
    """One JSON line per record: appended by whichever process saw the event, read whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(record)) + "\n")


def _read(path: Path, kind: type) -> list:
    """The records of a JSON-lines file, oldest first; a line that is no record (one cut by a
    kill) is skipped, and a missing file has none."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(kind(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return out


# --- fault injection (tests only) -------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    attempt: int | None = None  # None: in every attempt (a fault that repeats)


class FaultSpecError(ValueError):
    pass


def parse_faults(value: str | None) -> list[Fault]:
    """`test-only, kills this job: rank=1 step=5 fault=exit attempt=0; rank=0 step=9 fault=hang`.

    Empty or unset: no faults. A value without the arming prefix, or one that does not parse,
    is an error (never ignored: a test that meant to inject a fault must not pass without one)."""
    if not value:
        return []
    if not value.startswith(ARMING):
        raise FaultSpecError(f"{FAULT_ENV} must begin with {ARMING!r} (tests only); unset it for a real job")
    faults = []
    for part in filter(None, (p.strip() for p in value[len(ARMING):].split(";"))):
        try:
            fields = dict(item.split("=", 1) for item in part.split())
            kind = fields.pop("fault")
            fault = Fault(kind, int(fields.pop("rank")), int(fields.pop("step")),
                          int(fields.pop("attempt")) if "attempt" in fields else None)
        except (ValueError, KeyError) as exc:
            raise FaultSpecError(f"{FAULT_ENV}: cannot read {part!r} ({exc}); write "
                                 "'rank=R step=S fault=KIND [attempt=A]'") from exc
        if fields or kind not in FAULT_KINDS:
            raise FaultSpecError(f"{FAULT_ENV}: {part!r}: fault is one of {', '.join(FAULT_KINDS)}, "
                                 "fields are rank, step, fault and attempt")
        faults.append(fault)
    return faults


def fault_spec(*faults: Fault) -> str:
    """The variable's value for `faults` (tests build theirs with this)."""
    parts = [f"rank={f.rank} step={f.step} fault={f.kind}" + (f" attempt={f.attempt}" if f.attempt is not None else "")
             for f in faults]
    return f"{ARMING} " + "; ".join(parts)
