"""A hyperparameter sweep's cost and time before any trial runs.

Each checked trial (the ranges' extremes and every categorical value, one name at a time, then
all at their minima and all at their maxima: launcher.config.tuning_rules.trial_variants) is
planned like any job. The sweep's figures take the WORST of them, so they are an upper bound: a
trial's time is its predicted steps x step time (at most the job's max_run); the sweep's time is
that x ceil(max_jobs / max_parallel_jobs) rounds; its cost, that trial's cost x max_jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from launcher.config import ValidatedJob, validate_job
from launcher.config.tuning import TuningConfig
from launcher.config.tuning_rules import trial_instances, trial_settings, trial_variants
from launcher.plan.configurations import plan
from launcher.plan.fits import PredictedOOMError
from launcher.plan.report import PlanResult


@dataclass
class TrialPlan:
    values: dict[str, Any]  # the tuned values of this trial (and its instance, where the sweep chooses)
    result: PlanResult

    @property
    def seconds(self) -> float | None:
        speed, job = self.result.throughput, self.result.job
        if speed is None or job is None or job.settings is None:
            return None
        return min(job.settings.max_steps * speed.step_s, job.config.max_run)

    @property
    def usd(self) -> float | None:
        speed, seconds = self.result.throughput, self.seconds
        if seconds is None or speed is None or speed.usd_per_hour is None:
            return None
        return seconds / 3600 * speed.usd_per_hour


@dataclass
class SweepPlan:
    tuning: TuningConfig
    trials: list[TrialPlan] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return math.ceil(self.tuning.trial_count() / self.tuning.max_parallel_jobs)

    @property
    def costliest(self) -> TrialPlan | None:
        """The trial that costs most (or, where no price is known, runs longest)."""
        priced = [t for t in self.trials if t.usd is not None] or [t for t in self.trials if t.seconds is not None]
        return max(priced, key=lambda t: t.usd if t.usd is not None else t.seconds, default=None)

    @property
    def fits(self) -> bool | None:
        """Whether every checked trial fits in accelerator memory; None where some cannot be planned."""
        known = [t.result.fits for t in self.trials]
        if any(f is False for f in known):
            return False
        return None if any(f is None for f in known) else True

    @property
    def seconds(self) -> float | None:
        worst = self.costliest
        return worst.seconds * self.rounds if worst and worst.seconds is not None else None

    @property
    def usd(self) -> float | None:
        worst = self.costliest
        return worst.usd * self.tuning.trial_count() if worst and worst.usd is not None else None

    def to_dict(self) -> dict:
        worst = self.costliest
        return {"trials": self.tuning.trial_count(), "max_parallel_jobs": self.tuning.max_parallel_jobs,
                "rounds": self.rounds, "basis": "worst checked trial",
                "trial_seconds": worst.seconds if worst else None, "trial_usd": worst.usd if worst else None,
                "costliest_trial": worst.values if worst else None, "sweep_seconds": self.seconds,
                "sweep_usd": self.usd, "fits": self.fits,
                "not_fitting": [t.values for t in self.trials if t.result.fits is False]}

    def report(self) -> str:
        """The printable summary (`tuner.plan()`, `smlaunch tune JOB --plan`)."""
        t, worst = self.tuning, self.costliest
        lines = [f"sweep: {t.trial_count()} trial(s), {t.max_parallel_jobs} at a time -> {self.rounds} round(s); "
                 f"figures from the worst of {len(self.trials)} checked trial(s) (ranges' extremes and categories)"]
        if worst is None:
            why = next((r.result.nothing_to_plan or "; ".join(r.result.errors) for r in self.trials
                        if r.result.nothing_to_plan or r.result.errors), "no trial could be planned")
            lines.append(f"  cost and time: not predicted ({why})")
        else:
            lines.append(f"  costliest trial: {_values(worst.values)}: {_hours(worst.seconds)}"
                         + (f", ${worst.usd:,.2f}" if worst.usd is not None else ", price unknown"))
            lines.append(f"  sweep: at most {_hours(self.seconds)}"
                         + (f" and ${self.usd:,.2f}" if self.usd is not None else ""))
        bad = [x for x in self.trials if x.result.fits is False]
        if bad:
            lines.append("  memory: trials that do not fit: " + "; ".join(
                f"{_values(x.values)} ({x.result.memory.peak_gib:.1f} of {x.result.memory.capacity_gib:.0f} GiB)"
                for x in bad))
        else:
            lines.append("  memory: every checked trial fits" if self.fits else
                         "  memory: not predicted for every trial (the planner cannot size them)")
        return "\n".join(lines)


def _values(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _hours(seconds: float | None) -> str:
    return "unknown time" if seconds is None else f"{seconds / 3600:.2f} h"


def plan_sweep(job: ValidatedJob, tuning: TuningConfig) -> SweepPlan:
    """Plan every checked trial of a sweep over `job` (whose own tuning section, if any, is ignored)."""
    out = SweepPlan(tuning)
    for instance in trial_instances(tuning):
        for values in trial_variants(tuning):
            settings = trial_settings(job, values, instance)
            trial = validate_job(settings, base_dir=job.base_dir, model=type(job.config))
            out.trials.append(TrialPlan({**values, **instance}, plan(trial, advise=False)))
    return out


def sweep_report(job: ValidatedJob) -> str:
    """The report for a job with a `tuning:` section (the CLI's `smlaunch tune JOB --plan`)."""
    if job.config.tuning is None:
        raise ValueError("the job has no tuning: section to plan")
    return plan_sweep(job, job.config.tuning).report()


def check_sweep_fits(job: ValidatedJob, tuning: TuningConfig) -> SweepPlan:
    """Refuse a sweep whose trials the planner predicts to run out of memory (fit(force=True) overrides)."""
    sweep = plan_sweep(job, tuning)
    for trial in sweep.trials:
        if trial.result.oom:
            error = PredictedOOMError(trial.result)
            error.args = (f"the sweep's trial with {_values(trial.values)} would not fit:\n{error.args[0]}",)
            raise error
    return sweep
