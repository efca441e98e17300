"""Which failures the bootstrap restarts (docs/faults.md, "Automatic restarts").

A restart costs the fleet a start-up, a checkpoint load and the steps since that checkpoint;
restarting a job that cannot succeed costs that `max_restarts` times over. So a failure is put in
one of three classes (launcher.wire.faults):

- FAULT, restarted while restarts remain: a rank killed by a signal (a crash, the OOM killer, a
  lost GPU), a hung rank (its step watchdog left with EXIT_HUNG) or a frozen one, a rank that
  failed in a collective (a peer failed or stopped answering), a non-finite loss the job asked to
  roll back, and an error raised after the attempt made progress that is not one of the kinds
  below (a transient device or network error);
- JOB_ERROR, never restarted: an exception of a kind that says the job itself is wrong (an
  import, a type, a value, a missing file, a bad record, a full disk, out of memory, a non-finite
  loss under `nonfinite_policy=fail`), or any exception before the attempt's first step (a shape
  error at step 0 comes back on every restart);
- REPEATED, not restarted: the same failure as the previous attempt's (the same rank and cause)
  with no step completed beyond it: a fault that comes back where it was is not transient.

The job's own rules come first (launcher.wire.restart_policy): an exit code it lists in
`restart_on_exit_codes` is REQUESTED (restarted, not counted against max_restarts), and a
JOB_ERROR is retried while fewer than `restart_on_job_errors` have been.

smlaunch's runtime leaves a record of each failing rank (launcher.wire.faults.RankFailure: the
exception's classes, the last step it completed and the step it started from). A user's own
script leaves none: its exception's name is read from its traceback, and its progress is unknown,
so its exceptions count as faults (restarted) unless their kind is a job error, and a second
identical failure in a row stops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from launcher.wire.faults import (
    EXIT_HUNG,
    EXIT_NONFINITE_ROLLBACK,
    FAULT,
    JOB_ERROR,
    REPEATED,
    REPEATED_WHY,
    RankFailure,
    Restart,
    repeats,
)
from launcher.wire.restart_policy import REQUESTED, RestartPolicy, job_errors_retried

# Exceptions that come back on a restart: the job's code, configuration or data is wrong, or the
# job does not fit its machine. Matched against every class of the exception (its __mro__), so
# smlaunch's own errors (CheckpointError is a RuntimeError; PretrainedError a ValueError) need
# naming only where their base would not say it.
JOB_ERRORS = frozenset({
    "ImportError", "SyntaxError", "NameError", "AttributeError", "TypeError", "ValueError", "LookupError",
    "AssertionError", "NotImplementedError", "ArithmeticError", "FileNotFoundError", "IsADirectoryError",
    "NotADirectoryError", "PermissionError", "UnicodeError",
    "OutOfMemoryError",  # torch.OutOfMemoryError: the same layout runs out of memory again
    "FloatingPointError",  # a non-finite loss under nonfinite_policy=fail: the data or the lr, not chance
    "CheckpointError",  # no usable checkpoint: a restart finds the same ones
    "CheckpointWriteError",  # a full or read-only disk stays full
    "ContractError", "RequirementsError",  # the job cannot start as described
    "TrackerUnavailable", "PackError", "EndOfData",
    # subclasses by their own names: a script's traceback gives only the name
    "ModuleNotFoundError", "IndentationError", "TabError", "KeyError", "IndexError", "ZeroDivisionError",
    "UnicodeDecodeError", "UnicodeEncodeError", "JSONDecodeError", "UnboundLocalError",
})
NONFINITE = "non-finite loss"
BEFORE_FIRST_STEP = "before the attempt's first step: a restart would fail the same way"
_TRACEBACK_LAST = re.compile(r"^(?:\[rank\d+\]: )?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Fault|Interrupt))\b",
                             re.MULTILINE)


@dataclass(frozen=True)
class Failure:
    """What ended an attempt, as the bootstrap diagnosed it."""
    header: str  # 'rank 1 (host algo-1, local rank 1) exited with code 1'
    exit_code: int  # the failing process's code (128 + N for signal N)
    signal: bool = False  # killed by a signal
    rank: int | None = None
    frozen: bool = False  # a rank was stopped (SIGSTOP) while its peers ran
    stderr_tail: str = ""  # the failing rank's (or the script's) stderr
    hung: bool = False  # a script of the user's own showed no CPU and no output for its hang_timeout


@dataclass(frozen=True)
class Decision:
    failure_class: str
    why: str  # the class's reason in a few words
    detail: str  # the cause a repeat is recognised by: the exception's name, the signal, "hung"
    step: int | None
    start_step: int | None
    retried: bool = False  # a job error the job's restart_on_job_errors retries

    @property
    def restart(self) -> bool:
        return self.failure_class in (FAULT, REQUESTED) or self.retried


def classify(failure: Failure, records: dict[int, RankFailure], previous: list[Restart],
             policy: RestartPolicy = RestartPolicy()) -> Decision:
    """The class of `failure`, given the ranks' failure records of this attempt, the earlier
    attempts' records (launcher.wire.faults.read_restarts) and the job's own rules."""
    step, start = _progress(records)
    if failure.exit_code in policy.exit_codes and not failure.signal:
        return Decision(REQUESTED, f"exit code {failure.exit_code} is one of the job's restart_on_exit_codes",
                        f"exit code {failure.exit_code}", step, start)
    decision = _first_class(failure, records, step, start)
    if decision.failure_class == JOB_ERROR and job_errors_retried(previous) < policy.job_errors:
        # the job asked for these retries: no repeat rule stops them before they are used
        return replace(decision, why=f"{decision.why}; retried (restart_on_job_errors {policy.job_errors})",
                       retried=True)
    # a rollback trains past the batch it skips: the next attempt differs, and nonfinite_max bounds them.
    # An error before the attempt's first step that the attempt before met too is that fault, back.
    again = decision.failure_class == FAULT or decision.why.endswith(BEFORE_FIRST_STEP)
    if again and decision.detail != NONFINITE and repeats(previous, decision.detail, step, failure.rank):
        return Decision(REPEATED, REPEATED_WHY, decision.detail, step, start)
    return decision


def _first_class(failure: Failure, records: dict[int, RankFailure], step, start) -> Decision:
    # first: a frozen rank, once continued, may itself leave through its step watchdog (exit 86)
    if failure.frozen:
        return Decision(FAULT, "a rank was stopped (frozen) while its peers ran", "frozen", step, start)
    if failure.exit_code == EXIT_HUNG or failure.hung:
        return Decision(FAULT, "a rank made no progress within its step timeout (hung)", "hung", step, start)
    if failure.exit_code == EXIT_NONFINITE_ROLLBACK:
        return Decision(FAULT, "a non-finite loss, rolled back as nonfinite_policy=rollback asks",
                        NONFINITE, step, start)
    if failure.signal:
        return Decision(FAULT, "a process was killed by a signal (a crash, the OOM killer, a lost device)",
                        failure.header.rsplit(" ", 1)[-1], step, start)
    own = [r for r in records.values() if not r.collective]
    if records and not own:  # every failing rank failed in a collective: a peer's failure, elsewhere
        return Decision(FAULT, "ranks failed in a collective: a peer failed or stopped answering",
                        "collective", step, start)
    names = own[0].bases if own else _exception_names(failure.stderr_tail)
    name = names[0] if names else f"exit code {failure.exit_code}"
    if JOB_ERRORS.intersection(names):
        return Decision(JOB_ERROR, f"{name} is an error of the job's code, configuration or data", name, step, start)
    if own and not own[0].progressed:
        return Decision(JOB_ERROR, f"{name} {BEFORE_FIRST_STEP}", name, step, start)
    return Decision(FAULT, f"{name} after the attempt made progress" if own else
                    f"{name} (a script that reports no progress: restarted unless it repeats)", name, step, start)


def _progress(records: dict[int, RankFailure]) -> tuple[int | None, int | None]:
    """The attempt's last completed step and start step: the least any failing rank completed."""
    steps = [r.step for r in records.values() if r.step is not None]
    starts = [r.start_step for r in records.values() if r.start_step is not None]
    return (min(steps) if steps else None), (min(starts) if starts else None)


def _exception_names(stderr: str) -> tuple[str, ...]:
    """A script's exception, from the last line of its traceback that names one."""
    found = _TRACEBACK_LAST.findall(stderr)
    return (found[-1].rsplit(".", 1)[-1],) if found else ()


def backoff_s(restart_number: int) -> float:
    """Seconds before restart N (1, 2, ...): 1, 2, 4, ... at most 30. Long enough for ports and
    devices to be released, short next to the start-up a restart costs anyway."""
    return float(min(2 ** max(restart_number - 1, 0), 30))
