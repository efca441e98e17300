"""What `nonfinite_policy` and `nonfinite_max` ask of the hyperparameters (launcher.wire.training.nonfinite):
a rollback needs checkpoints to go back to, and a bound means something only under skip or
rollback. Validation runs these for smlaunch's train.py, with the restart a rollback needs (the
restart budget is the job's: launcher.config.runtime_rules); the container runs them again before
anything is built."""

from __future__ import annotations

from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.issues import Issue
from launcher.wire.training.nonfinite import FAIL, ROLLBACK

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
