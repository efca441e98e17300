"""What `nonfinite_policy` and `nonfinite_max` ask of the job (launcher.config.nonfinite): a rollback
needs checkpoints to go back to and a restart to go back with, and a bound means something only
under skip or rollback. Validation runs these for smlaunch's train.py; the container runs the
hyperparameters' again before anything is built (the restart budget is the job's, not theirs)."""

from __future__ import annotations

from launcher.config.hyperparameters import TrainingHyperparameters
from launcher.config.issues import Issue
from launcher.config.nonfinite import FAIL, ROLLBACK

HP = "hyperparameters"


def nonfinite_issues(hp: TrainingHyperparameters) -> list[Issue]:
    issues = []
    if hp.nonfinite_policy == ROLLBACK and not hp.checkpoint_freq:
        issues.append(Issue(f"{HP}.nonfinite_policy", ROLLBACK, "goes back to the newest checkpoint at a non-finite "
                            "step, but checkpoint_freq is unset, so no checkpoint is written",
                            "set checkpoint_freq: N (steps between saves), or use nonfinite_policy: skip"))
    if hp.nonfinite_max is not None and (hp.nonfinite_policy or FAIL) == FAIL:
        issues.append(Issue(f"{HP}.nonfinite_max", hp.nonfinite_max, "bounds the non-finite steps that "
                            "nonfinite_policy skip or rollback tolerate; under fail (the default) the first one "
                            "fails the job", "set nonfinite_policy: skip or rollback, or remove nonfinite_max"))
    return issues


def check_nonfinite(ctx) -> list[Issue]:
    """nonfinite_issues for smlaunch's runtime (context.Context); a user's own script reads these keys as it likes."""
    if not ctx.runtime:
        return []
    return nonfinite_issues(ctx.hp) + _rollback_restarts(ctx.job)


def _rollback_restarts(job) -> list[Issue]:
    """A rollback is a restart (the ranks leave, the bootstrap starts them again from the checkpoint):
    without max_restarts nothing restarts them, and the job would fail at its first non-finite step
    as under fail, while its log says it rolls back. Refused rather than quietly run as fail."""
    if job.hyperparameters.nonfinite_policy != ROLLBACK or job.max_restarts:
        return []
    return [Issue(f"{HP}.nonfinite_policy", ROLLBACK, "restarts the job from its newest checkpoint at a "
                  "non-finite step, but max_restarts is 0, so nothing restarts it: the job would fail there",
                  "set max_restarts: N (each rollback uses one restart), or use nonfinite_policy: skip or fail")]
