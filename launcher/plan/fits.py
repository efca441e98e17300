"""`submit` and `fit()` refuse a job the planner predicts to run out of accelerator memory, and, when
the job asks for its trace (`trace: true`, `submit --trace`), a job whose trace fails or whose traced
peak does not fit."""

from __future__ import annotations

from launcher.plan.configurations import plan
from launcher.plan.memory import SAFETY_MARGIN, required_gib
from launcher.plan.report import PlanResult, explain_oom
from launcher.plan.trace import Trace, TraceError, run_trace

GIB = 2**30


class PredictedOOMError(ValueError):
    """`submit`/`fit()` refuse a job the planner predicts to run out of accelerator memory."""

    def __init__(self, result: PlanResult):
        self.result = result
        self.explanation = explain_oom(result.memory)
        super().__init__(self.explanation + "\nTo submit anyway: smlaunch submit --force, or fit(force=True).")


def check_fits(job) -> PlanResult | None:
    """Plan a validated job; raise PredictedOOMError if it will not fit. None when the job cannot
    be planned (unknown model): the planner then has nothing to say, and nothing is refused."""
    result = plan(job)
    if result.oom:
        raise PredictedOOMError(result)
    return result if result.valid else None


class TraceRefusal(ValueError):
    """`submit`/`fit()` with the trace asked for: it failed, did not run, or its peak does not fit."""


def check_trace(job) -> Trace:
    """Trace the validated job (launcher.plan.trace); raise TraceRefusal when the trace fails, the
    job's step cannot be traced (asked for, never silently skipped), or a traced rank's peak, with the
    planner's allocator reserve, CUDA context and NCCL buffers added, exceeds the usable memory."""
    if job.layout is None or job.model is None:
        raise TraceRefusal("trace: true: the job's world size or model is unknown, so there is nothing to trace; "
                           "set processes_per_host and the model, or set trace: false")
    try:
        trace = run_trace(job)
    except TraceError as exc:
        raise TraceRefusal(f"the trace failed: {exc}") from None
    if trace.not_traced:
        raise TraceRefusal(f"trace: true, but this job's step cannot be traced: {trace.not_traced}; "
                           "set trace: false (or drop --trace) to submit it untraced")
    capacity = job.instance.accelerator.memory_gib if job.instance and job.instance.accelerator else None
    for rank in trace.ranks if capacity else ():
        peak = traced_peak_gib(rank["peak_bytes"], trace.world_size)
        if peak > capacity * (1 - SAFETY_MARGIN):
            raise TraceRefusal(
                f"the traced step does not fit: rank {rank['rank']} peaks at {peak:.2f} GiB "
                f"({rank['peak_bytes'] / GIB:.2f} GiB of live tensors, in the {rank['peak_at']['phase']}, in "
                f"{rank['peak_at']['module']}, plus allocator reserve and CUDA context) where "
                f"{capacity * (1 - SAFETY_MARGIN):.2f} GiB of {capacity:g} are usable; "
                "`smlaunch plan JOB` lists the settings that lower the peak")
    return trace


def traced_peak_gib(live_bytes: int, world: int) -> float:
    """A traced peak of live tensors as the planner turns its own into what must fit (memory.py)."""
    return required_gib(live_bytes / GIB, world)
