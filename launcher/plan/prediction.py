"""What `smlaunch plan` predicts for a job, in the few figures a run's dashboard compares with
what the runtime measures: the runtime's own metric names where the two mean the same
(`peak_memory_gib`, `tokens_per_s_per_gpu`, `tflops_per_gpu`, `mfu`). The job carries it to its
trackers in its code archive (launcher.wire.job_plan)."""

from __future__ import annotations

import logging

from launcher.config import ValidatedJob
from launcher.plan.configurations import plan
from launcher.plan.report import PlanResult

log = logging.getLogger(__name__)


def prediction(job: ValidatedJob) -> dict:
    """The job's prediction, or why it has none (a local job, a script that does not say its
    model, a job the planner cannot model): a tracker then says that rather than nothing."""
    try:
        return summary(plan(job, advise=False))
    except Exception as exc:  # noqa: BLE001 - a planner bug must not stop a submit: said here and in the runs
        reason = f"the planner failed ({type(exc).__name__}: {exc}); `smlaunch plan` on the job shows it"
        log.warning("%s: the job's trackers get no prediction", reason)
        return {"instance_type": job.config.instance_type, "instance_count": job.config.instance_count,
                "nothing_planned": reason}


def summary(result: PlanResult) -> dict:
    out = {"models": result.models, "instance_type": result.settings["instance_type"],
           "instance_count": result.settings["instance_count"]}
    if result.nothing_to_plan or result.errors:
        return {**out, "nothing_planned": result.nothing_to_plan or "; ".join(result.errors)}
    mem, speed = result.memory, result.throughput
    out.update(fits=mem.fits, peak_memory_gib=round(mem.peak_gib, 3), capacity_gib=mem.capacity_gib,
               dominant_memory=mem.dominant.key)
    if speed is not None:
        out.update(tokens_per_s=round(speed.tokens_per_s, 1), tokens_per_s_per_gpu=round(speed.tokens_per_s_per_gpu, 1),
                   step_s=round(speed.step_s, 4), tflops_per_gpu=round(speed.tflops_per_gpu, 1),
                   mfu=round(speed.mfu, 4), bound_by=speed.bound_by, usd_per_hour=speed.usd_per_hour,
                   usd_per_billion_tokens=None if speed.usd_per_billion_tokens is None
                   else round(speed.usd_per_billion_tokens, 2))
    if result.staging is not None:
        out.update(checkpoint_staging_gib_per_host=round(result.staging.per_host_gib, 3),
                   checkpoint_staging_fits=result.staging.fits)
    return out
