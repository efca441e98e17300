"""`min_instance_count`: where a job may go on with fewer hosts, and what it does there
(docs/faults.md, "Shrink and go on"; the supervisor's part is launcher.local.shrink, the runtime's
launcher.wire.training.shrink, whose rule this checks for every world the job may shrink to)."""

from __future__ import annotations

from launcher.config import backend_table
from launcher.wire.training.issues import Issue
from launcher.wire.training.shrink import shrink_problems

FIELD = "min_instance_count"


def check_min_instance_count(ctx) -> list[Issue]:
    job = ctx.job
    least = job.min_instance_count
    if least is None:
        return []
    row = backend_table.named(job.backend_name)
    if not row.shrinks:
        return [Issue(FIELD, least, f"is refused on backend {row.name}: {row.shrink}", f"remove {FIELD}")]
    if least > job.instance_count:
        return [Issue(FIELD, least, f"exceeds instance_count {job.instance_count}",
                      f"set {FIELD} to at most {job.instance_count}")]
    if not job.max_restarts:
        return [Issue(FIELD, least, "a job goes on with fewer hosts by a restart, and max_restarts is 0",
                      "set max_restarts (each shrink is one of its restarts)")]
    sharded = [name for name, channel in job.channels().items() if channel.distribution == "ShardedByS3Key"]
    if sharded:  # the lost host's part of the channel would be read by no host left
        return [Issue(FIELD, least, f"channel {sharded[0]} is ShardedByS3Key: the hosts left would not read the "
                      "part of it the lost host had", f"use FullyReplicated for {sharded[0]}, or remove {FIELD}")]
    return _runtime_issues(ctx, least) + [Issue(FIELD, least, _what(ctx, row), level="info")]


def _what(ctx, row) -> str:
    left = f"the hosts left, down to {ctx.job.min_instance_count} of {ctx.job.instance_count}"
    batch = ("smlaunch's train.py keeps the global batch: the lost ranks' share goes to gradient accumulation on "
             "the others" if ctx.runtime else "your script gets the smaller world and SMLAUNCH_ORIGINAL_WORLD (the "
             "ranks it had): its batch is its own to keep")
    return (f"when a host is gone for good ({row.shrink}), the job restarts on {left}, from its newest verified "
            f"checkpoint, and never grows back; {batch} (docs/faults.md)")


def _runtime_issues(ctx, least: int) -> list[Issue]:
    """smlaunch's runtime at each world the job may shrink to: one whose layout or global batch it cannot
    keep is refused now, not after a host is lost."""
    if not ctx.runtime or ctx.processes_per_host is None:
        return []
    per_host, original = ctx.processes_per_host, ctx.world
    for hosts in range(ctx.job.instance_count - 1, least - 1, -1):
        problems = shrink_problems(ctx.params, original, hosts * per_host)
        if problems:
            why = "; ".join(f"{p.key} {p.value}: {p.problem}" for p in problems)
            return [Issue(FIELD, least, f"at {hosts} host(s) smlaunch's runtime could not go on: {why}",
                          f"set {FIELD} to {hosts + 1} or more, or change the layout")]
    return []
