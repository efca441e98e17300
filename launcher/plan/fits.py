"""`submit` and `fit()` refuse a job the planner predicts to run out of accelerator memory."""

from __future__ import annotations

from launcher.plan.configurations import plan
from launcher.plan.report import PlanResult, explain_oom


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
