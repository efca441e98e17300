"""Rules that relate the backend to the rest of the job, for every row of the backend table: the
instance types a backend runs, a section read only by its own backend, and each backend's own rules."""

from __future__ import annotations

from launcher.config import backend_table
from launcher.config.context import Context
from launcher.wire.training.issues import Issue


def check_backend_choice(ctx: Context) -> list[Issue]:
    job = ctx.job
    issues = []
    chosen = backend_table.named(job.backend) if job.backend else None
    if chosen is not None and not chosen.runs(job.is_local) and job.is_local:
        issues.append(Issue("backend", chosen.name, f"runs on ml.* instances, and instance_type is {job.instance_type}",
                            "pick an ml.* instance type, or use backend: " + _running(local=True)))
    elif chosen is not None and not chosen.runs(job.is_local):
        issues.append(Issue("backend", chosen.name, f"runs on this machine, which is not a {job.instance_type}",
                            "set instance_type: local (CPU) or local_gpu, or use backend: " + _running(local=False)))
    for row in backend_table.with_sections():
        if getattr(job, row.name) is not None and job.backend_name != row.name:
            issues.append(Issue(row.name, "{...}", f"is only read by backend {row.name}, and the job runs on "
                                f"{job.backend_name}", f"set backend: {row.name} (or --backend {row.name}), "
                                f"or remove the {row.name} section"))
    running = backend_table.named(job.backend_name)
    if running is not None and running.rules is not None:
        issues += backend_table.load(running.rules)(ctx)
    return issues


def _running(local: bool) -> str:
    """The backends that run this kind of instance type, as a fix names them."""
    return " or ".join(b.name for b in backend_table.BACKENDS if b.runs(local))
