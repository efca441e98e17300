"""What `smlaunch status` and `smlaunch list` print, for a job of any backend.

`status` adds to DescribeTrainingJob's fields the job's progress (launcher.wire.metric_lines) and its newest
complete checkpoint (launcher.wire.checkpoints), as `Progress` and `LastCheckpoint`; `list` is a table
that fits an 80-column terminal: the handle whole (it is what the other commands take), the
status, the restarts and the goodput where there are some, when it was created and how long it ran.
"""

from __future__ import annotations

from dataclasses import asdict

# Imports inside functions: a job's metrics load only for `status` of a job without progress.
from launcher.backends import warm_pools
from launcher.backends.base import TERMINAL_STATUSES
from launcher.local import shrink
from launcher.wire.checkpoints import UNVERIFIED
from launcher.wire.masking import mask_secrets
from launcher.wire.metric_lines import DamagedMetrics, Progress, as_datetime, clock
from launcher.wire.restart_policy import REQUESTED
from launcher.wire.terminal import printable


def describe(backend, name: str) -> dict:
    """The job's description, secrets masked, with `Progress` and `LastCheckpoint` when it has them."""
    desc = mask_secrets(backend.describe(name))  # a FailureReason may quote one
    current = backend.progress(name)
    if current is not None:
        desc["Progress"] = current.to_dict()
    checkpoint = backend.checkpoint(name)
    if checkpoint is not None:
        desc["LastCheckpoint"] = checkpoint.to_dict()
    restarts = backend.restarts(name)
    if restarts:
        desc["Restarts"] = [asdict(r) for r in restarts]
    try:
        measured = backend.goodput(name)
    except DamagedMetrics as exc:  # the job's status all the same, and why it has no goodput
        desc["Goodput"] = {"error": str(exc), "text": f"goodput not measured: {exc}"}
        measured = None
    if measured is not None:
        desc["Goodput"] = {**measured.to_dict(), "text": measured.text()}
    if current is None and backend.job_dir(name):  # a user script: its metric_definitions over the job's log here
        last = _last_log_metrics(backend, name)
        if last:
            desc["LastMetrics"] = last
    return desc


def _last_log_metrics(backend, name: str) -> dict[str, tuple[int, float]]:
    """Each metric's last (point, value) from the job's metric_definitions on its log."""
    from launcher.backends.base import BackendError

    try:
        metrics = backend.metrics(name)
    except (BackendError, DamagedMetrics, KeyError):  # no metrics, or a backend whose jobs keep no job directory
        return {}
    if metrics.x != "point":
        return {}
    last: dict[str, tuple[int, float]] = {}
    for record in metrics.records:
        for key, value in record.items():
            if key != "point":
                last[key] = (record["point"], value)
    return last


def status_lines(backend_name: str, name: str, desc: dict) -> list[str]:
    status = desc["TrainingJobStatus"]
    secondary = desc.get("SecondaryStatus")
    shown = status if not secondary or secondary == status else f"{status} ({secondary})"
    lines = [f"{desc.get('TrainingJobName', name)}: {shown}", f"backend: {backend_name}"]
    if desc.get("SlurmJobId"):
        lines.append(f"slurm job: {desc['SlurmJobId']} {desc.get('SlurmJobState', '')} "
                     f"{desc.get('SlurmReason', '')}".rstrip())
    current = Progress.of(desc.get("Progress") or {})
    if current is not None:
        ended = status in TERMINAL_STATUSES
        lines.append(("last step: " if ended else "progress: ") + current.text(eta=not ended))
    elif desc.get("LastMetrics"):  # a script of the user's own: its metric_definitions over the log
        values = ", ".join(f"{key} {value:g} ({'its only value' if point == 1 else f'the last of {point}'})"
                           for key, (point, value) in desc["LastMetrics"].items())
        lines.append(f"last metrics (metric_definitions on the log): {values}")
    checkpoint = desc.get("LastCheckpoint")
    if checkpoint:
        copy = f" (copied to {checkpoint['CopiedTo']})" if checkpoint.get("CopiedTo") else ""
        verified = "" if checkpoint.get("Verified") else UNVERIFIED
        lines.append(f"last checkpoint: step {checkpoint['Step']}, {checkpoint['Location']}{copy}{verified}")
    elif status == "Stopped":
        lines.append("last checkpoint: none")
    lines += restart_lines(desc)
    if desc.get("Goodput"):
        lines.append(desc["Goodput"]["text"])
    if desc.get("StopReason"):  # who stopped it: the user, or a sweep's early stopping
        lines.append(f"stopped: {printable(desc['StopReason'])}")
    if desc.get("FailureReason"):  # the job's own output: no terminal control but colour
        lines.append(f"failure reason: {printable(desc['FailureReason'])}")
    artifacts = (desc.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if artifacts:
        lines.append(f"model artifacts: {artifacts}")
    if desc.get("WarmPool"):  # a SageMaker job's warm pool (launcher.backends.warm_pools)
        lines.append(warm_pools.status_line(desc["WarmPool"]))
    if desc.get("RecordNotUpdated"):  # a local record that a read could not rewrite (a full disk)
        lines.append(f"note: {desc['RecordNotUpdated']}")
    if desc.get("StorageNote"):  # a Kubernetes job on a claim this machine does not mount
        lines.append(f"note: {desc['StorageNote']}")
    return lines


def restart_lines(desc: dict) -> list[str]:
    """'restarts: 1 of 2 (max_restarts)' and a line for each failed attempt: when, the step, the
    class, the reason, and for a restart the steps replayed and the time until training again.
    Nothing for a job that restarted nothing and has no max_restarts: its one failure is its failure
    reason. (A Kubernetes record has no MaxRestarts: its restarts are counted without a budget.)"""
    failures = desc.get("Restarts") or []
    allowed = desc.get("MaxRestarts")
    restarted = [f for f in failures if f.get("restarted")]
    requested = sum(1 for f in restarted if f.get("failure_class") == REQUESTED)
    used = len(restarted) - requested
    if not restarted and not allowed:
        return []
    lines = [f"restarts: {used} of {allowed} (max_restarts)" if allowed else f"restarts: {used}"]
    if requested:  # restart_on_exit_codes: not counted against max_restarts
        lines[0] += f", and {requested} an exit code of restart_on_exit_codes asked for"
    for f in failures:
        step = f" at step {f['step']}" if f.get("step") is not None else ""
        action = "restarted" if f.get("restarted") else "not restarted"
        cost = f.get("extra") or {}
        spent = []
        if "resumed_from" in cost:
            replayed = f" ({cost['replayed_steps']} step(s) replayed)" if "replayed_steps" in cost else ""
            spent.append(f"resumed from step {cost['resumed_from']}{replayed}")
        if "down_s" in cost:
            spent.append(f"training again after {clock(cost['down_s'])}")
        tail = f"; {', '.join(spent)}" if spent else ""
        lines.append(f"  attempt {f['attempt']} failed{step} at {f['at']} ({f['failure_class']}, {action}): "
                     f"{printable(f['reason'])}{tail}")
    return lines + [f"  {shrink.text(s)}" for s in desc.get(shrink.SHRINKS) or []]



# The columns after the handle, most needed first, with the width their text takes; those of
# OPTIONAL only where a job has the field (a job that restarted, a job that measured its goodput).
COLUMNS = (("status", len("InProgress")), ("restarts", len("restarts")), ("duration", len("duration")),
           ("goodput", len("goodput")), ("created", len("11-22 18:55")))
OPTIONAL = {"restarts": "Restarts", "goodput": "Goodput"}
GAP = 2  # the space rich puts between columns (padding 0 1, no edge padding)
ORDER = ("status", "restarts", "goodput", "created", "duration")  # left to right


def jobs_table(jobs: list[dict], width: int = 80):
    """A rich Table of `registry.list_all`'s rows that fits `width` columns. The handle is never
    wrapped or cut (the other commands take it whole); when it is long, `created` gives way
    first, then `goodput`, `duration` and `restarts` (`list --json` has every field). `goodput` is
    there where a job measured one (smlaunch's runtime's jobs here and on Slurm)."""
    from rich.table import Table

    room = width - max((len(j["Handle"]) for j in jobs), default=len("job"))
    shown = []
    for name, need in COLUMNS:
        if name in OPTIONAL and all(j.get(OPTIONAL[name]) is None for j in jobs):
            continue
        if name == "status" or room >= need + GAP:
            shown.append(name)
            room -= need + GAP
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("job", no_wrap=True)
    shown = [name for name in ORDER if name in shown]
    if any(j.get("WarmPoolStatus") for j in jobs):  # only where a SageMaker job has a warm pool
        shown.append("warm pool")
    for name in shown:
        table.add_column(name, justify="right" if name in ("duration", "goodput") else "left", overflow="fold")
    for j in jobs:
        seconds = j.get("DurationSeconds")
        goodput = j.get("Goodput")
        cells = {"status": j["TrainingJobStatus"], "restarts": str(j.get("Restarts") or ""),
                 "goodput": "" if goodput is None else f"{goodput:.0%}",
                 "created": created_text(j.get("CreationTime")),
                 "duration": "" if seconds is None else clock(seconds),
                 "warm pool": (j.get("WarmPoolStatus") or {}).get("Status", "")}
        table.add_row(j["Handle"], *(cells[name] for name in shown))
    return table


def created_text(value) -> str:
    """'11-22 18:55', in this machine's time zone."""
    when = as_datetime(value)
    return when.astimezone().strftime("%m-%d %H:%M") if when else ""
