"""The restarts of a local or Slurm job: the ones its hosts' bootstraps made, and the ones the
supervisor makes when a host is gone (docs/faults.md, "Automatic restarts").

Each host's bootstrap appends its failures to `output/data/restarts.jsonl` in its /opt/ml tree
(launcher.wire.faults); the supervisor appends a lost host's to every host's, where the next
attempt's rank 0 finds it. One failure is seen by every host (the host where it happened, and the peers whose
collectives broke), so the job's list has one entry per attempt: the supervisor's if it has one,
else the one that names the cause rather than a peer's broken collective.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from launcher.local.spec import LocalJobSpec
from launcher.wire import faults, restart_policy
from launcher.wire.metric_lines import now, read_progress
from launcher.wire.opt_ml import master_host, process_ended

LOST = faults.HOST_LOST


def job_restarts(hosts: list[Path]) -> list[faults.Restart]:
    """One record per failed attempt, oldest first (`hosts`: the hosts' output data directories)."""
    records = [r for directory in hosts for r in faults.read_restarts(directory)]
    return merged_restarts(records, [s for d in hosts for s in faults.read_attempt_starts(d)])


def merged_restarts(records: list[faults.Restart], starts: list[faults.AttemptStart]) -> list[faults.Restart]:
    """One record per failed attempt of the hosts' `records` (the best-placed host's, with the step a
    peer knew where it knew none), oldest first, with what its restart cost (`starts`: attempts.jsonl's)."""
    by_attempt: dict[int, faults.Restart] = {}
    for record in records:
        kept = by_attempt.get(record.attempt)
        if kept is None or _rank(record) < _rank(kept):
            by_attempt[record.attempt] = record
    for attempt, kept in by_attempt.items():
        if kept.step is None:  # a killed rank records nothing: its peers know the step
            steps = [r.step for r in records if r.attempt == attempt and r.step is not None]
            if steps:
                by_attempt[attempt] = replace(kept, step=min(steps))
    began = {s.attempt: s for s in starts}
    return [_with_cost(by_attempt[a], began) for a in sorted(by_attempt)]


def _with_cost(record: faults.Restart, starts: dict[int, faults.AttemptStart]) -> faults.Restart:
    """`record` with what its restart cost, once the next attempt's loop has begun: the steps it
    ran again (those after the checkpoint it resumed from) and the seconds from the failure to
    training again."""
    after = next((starts[a] for a in sorted(starts) if a > record.attempt), None) if record.restarted else None
    if after is None:
        return record
    extra = dict(record.extra, resumed_from=after.start_step, training_again_at=after.at,
                 down_s=round(_seconds(record.at, after.at), 1))
    if record.step is not None:
        extra["replayed_steps"] = max(record.step - after.start_step, 0)
    return replace(record, extra=extra)


def _seconds(start: str, end: str) -> float:
    try:
        return max((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 0.0)
    except ValueError:
        return 0.0


def _rank(record: faults.Restart) -> int:
    """Which of an attempt's records tells most: a lost host; a frozen rank (its peers hung waiting
    for it); a crash or an error; a hang on the host whose diagnosis found a rank outside the
    collective (the others only waited in it); any other hang; last a peer's broken collective."""
    if record.detail == LOST:
        return 0
    if record.detail == "frozen":
        return 1
    if record.detail == "hung":
        diagnosis = str(record.extra.get("diagnosis", ""))  # launcher.wire.diagnostics.diagnose's line
        return 3 if diagnosis and not diagnosis.startswith(("every rank", "no rank's")) else 4
    return 5 if record.detail == "collective" else 2


def killed_by(code: int) -> int | None:
    """The signal that ended a host's process, if one did: -N from Popen for the bootstrap the
    process runner starts; 128+N where the host's process is a wrapper that reports its task's
    death the shell's way (srun for a Slurm step's task, `podman/docker start --attach` for a
    container's main process), which they do only for a signal (their own errors are below 128)."""
    if code < 0:
        return -code
    return code - 128 if 128 < code <= 128 + signal.SIGRTMAX else None


def ended(code: int) -> str:
    """How a host's process ended, naming the signal a wrapper reported as 128+N."""
    signum = killed_by(code)
    return process_ended(-signum if signum else code)


def lost_host(spec: LocalJobSpec, exits: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The first host that failed, if it was killed by a signal without leaving a failure report:
    its processes are gone (a lost node, a killed container), which its own bootstrap cannot
    restart."""
    failed = [(label, code) for label, code in exits if code != 0]
    if not failed:
        return None
    label, code = failed[0]
    report = spec.host_dir(label) / "output" / "failure"
    return (label, code) if killed_by(code) and not report.is_file() else None


def next_attempt(spec: LocalJobSpec) -> int:
    """The attempt after the newest any host or the supervisor recorded a failure of, or whose
    training began (attempts.jsonl): a host lost in an attempt its bootstraps had restarted into
    is lost in that attempt. One whose bootstraps had only begun a restart, their ranks not yet
    training, has not run: the supervisor's restart takes its number."""
    records = [r for host in spec.hosts for r in faults.read_restarts(spec.host_dir(host) / "output" / "data")]
    begun = [s.attempt for host in spec.hosts
             for s in faults.read_attempt_starts(spec.host_dir(host) / "output" / "data")]
    return max([spec.attempt, *(r.attempt for r in records), *begun]) + 1


def restartable(spec: LocalJobSpec, exits: list[tuple[str, int]]) -> bool:
    """A host was lost (lost_host) that the supervisor restarts (judge_loss)."""
    lost = lost_host(spec, exits) if spec.max_restarts else None
    return lost is not None and judge_loss(spec, lost[0], next_attempt(spec) - 1)[1] is None


def judge_loss(spec: LocalJobSpec, label: str, attempt: int) -> tuple[str, str | None]:
    """The class of `label`'s loss in attempt `attempt`, and why it is not restarted (None: it is):
    the repeat rule of every failure (launcher.wire.faults.repeats: the same host lost the attempt
    before, rank 0 having logged no step beyond it), then the budget (max_restarts, less the restarts
    an exit code of restart_on_exit_codes asked for)."""
    if faults.repeats(_earlier(spec, attempt), LOST, _logged_step(spec), host=label):
        return faults.REPEATED, f"not restarted ({faults.REPEATED}: {faults.REPEATED_WHY})"
    if counted_before(spec, attempt) >= spec.max_restarts:
        return faults.FAULT, f"not restarted: all {spec.max_restarts} restarts (max_restarts) used"
    return faults.FAULT, None


def counted_before(spec: LocalJobSpec, attempt: int) -> int:
    """The restarts before `attempt` that count against max_restarts (launcher.wire.restart_policy)."""
    return restart_policy.counted(attempt, _earlier(spec, attempt))


def earlier_failures(spec: LocalJobSpec, attempt: int, why: str) -> str:
    """What the FailureReason of a loss in `attempt` that is not restarted adds: `why`, and every
    failure of the job before it (launcher.wire.faults.gave_up, as the bootstrap's report has them)."""
    return faults.gave_up(why, _earlier(spec, attempt))


def _earlier(spec: LocalJobSpec, attempt: int) -> list[faults.Restart]:
    return [r for r in job_restarts([_data(spec, h) for h in spec.hosts]) if r.attempt < attempt]


def _logged_step(spec: LocalJobSpec) -> int | None:
    """Rank 0's last logged step: what the supervisor knows of a lost host's progress."""
    progress = read_progress(_data(spec, master_host(spec.hosts)))
    return progress.step if progress else None


def _data(spec: LocalJobSpec, host: str) -> Path:
    return spec.host_dir(host) / "output" / "data"


def record_loss(spec: LocalJobSpec, label: str, code: int, attempt: int, restarted: bool,
                failure_class: str = faults.FAULT, hosts_left: int | None = None) -> faults.Restart:
    """`hosts_left`: the job goes on without the host (launcher.local.shrink), which the reason says, and with it
    the trackers' restart event."""
    then = f"; the job goes on with {hosts_left} host(s) (min_instance_count)" if hosts_left else ""
    record = faults.Restart(
        attempt=attempt, at=now(), failure_class=failure_class, host=label, restarted=restarted, detail=LOST,
        step=_logged_step(spec),
        reason=f"{label} {ended(code)} without a failure report: the host's processes are gone{then}")
    for host in spec.hosts:  # where each host's next attempt reads the job's restarts (its trackers' event)
        faults.append_restart(_data(spec, host), record)
    return record
