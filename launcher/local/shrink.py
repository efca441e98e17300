"""A local or Slurm job that goes on with the hosts it still has when one is gone for good
(min_instance_count; docs/faults.md, "Shrink and go on").

The supervisor asks its runner where a lost host runs now (`host_lost`); where it cannot run
(RunnerError: a simulated host-gone, a Slurm node that left the allocation with no spare node), the
job goes on without it while min_instance_count allows: the spec loses the host, each remaining
host's resourceconfig.json names the hosts left, the next attempt gets the job's original world
(launcher.wire.training.shrink: the runtime keeps the global batch) and job.json's `Shrinks` says
from how many hosts to how many, at which step and attempt. A job never grows back. Rank 0 runs on the
first host left (launcher.wire.opt_ml.master_host): a shrink that loses it moves the job's records
(metrics.jsonl, progress.json) on to another host's tree (`rank0_hosts`).
"""

from __future__ import annotations

from launcher.local import store
from launcher.local.spec import LocalJobSpec
from launcher.wire.opt_ml import host_names, master_host, rewrite_hosts
from launcher.wire.terminal import printable

SHRINKS = "Shrinks"  # job.json: one entry per shrink, oldest first


def allowed(spec: LocalJobSpec) -> bool:
    """The job goes on without one more host."""
    return bool(spec.min_instance_count) and len(spec.hosts) - 1 >= spec.min_instance_count


def too_few(spec: LocalJobSpec) -> str:
    """What a lost host's reason adds where min_instance_count is set and the hosts left would be fewer."""
    if not spec.min_instance_count:
        return ""
    return f"; {len(spec.hosts) - 1} host(s) would be left, fewer than min_instance_count {spec.min_instance_count}"


def go_on_without(spec: LocalJobSpec, label: str, step: int | None, attempt: int) -> dict:
    """Drop `label` from the job (refusal found none); returns job.json's new Shrinks entry, recorded."""
    before = len(spec.hosts)
    spec.shrunk_from = spec.shrunk_from or before
    spec.hosts = [h for h in spec.hosts if h != label]
    for host in spec.hosts:
        rewrite_hosts(spec.host_dir(host), spec.hosts)
    spec.save()
    entry = {"from": before, "to": len(spec.hosts), "step": step, "attempt": attempt, "host": label}
    shrinks = store.merged(spec.job_dir).get(SHRINKS, [])
    store.update(spec.job_dir, **{SHRINKS: [*shrinks, entry]})
    return entry


def rank0_hosts(record: dict) -> list[str]:
    """The hosts rank 0 ran on, oldest first, from the job's job.json record: the last one's records are
    the current attempt's; an earlier one holds the steps before the shrink that lost it."""
    shrinks = record.get(SHRINKS) or []
    hosts = host_names(shrinks[0]["from"] if shrinks else 1)
    ran_on = [master_host(hosts)]
    for entry in shrinks:
        hosts = [h for h in hosts if h != entry["host"]]
        if hosts and master_host(hosts) != ran_on[-1]:
            ran_on.append(master_host(hosts))
    return ran_on


def text(entry: dict) -> str:
    """One shrink of a job's record: 'shrank from 2 to 1 host(s) at step 4 after attempt 0 (...)'."""
    step = f" at step {entry['step']}" if entry.get("step") is not None else ""
    return (f"shrank from {entry['from']} to {entry['to']} host(s){step} after attempt {entry['attempt']} "
            f"({printable(str(entry['host']))} gone; min_instance_count)")
