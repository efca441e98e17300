"""How a sweep chooses its trials' hyperparameters: Grid, Random (seeded) and Bayesian (Optuna's TPE).

Each strategy is asked for one trial's values at a time and told each trial's objective, so one
sweep loop drives them all. Grid and Random know every trial up front (`upfront`, for a dry run);
Bayesian chooses as results arrive. Scaling follows SageMaker: Logarithmic samples log-uniformly,
ReverseLogarithmic samples 1 - x log-uniformly (dense near 1), Linear and Auto uniformly (a local
sweep has no history to pick a scaling from, so Auto is Linear here; docs/tuning.md says so).
"""

from __future__ import annotations

import math
import random
from typing import Any

from launcher.config.tuning import CategoricalRange, IntegerRange, TuningConfig
from launcher.wire.training.issues import ConfigError, Issue

LOCAL_STRATEGIES = ("Bayesian", "Random", "Grid")


class Strategy:
    """Proposes trial values (`ask`) and learns their outcomes (`tell`)."""

    def __init__(self, tuning: TuningConfig, seed: int):
        self.tuning, self.seed = tuning, seed

    def ask(self, index: int) -> dict[str, Any] | None:
        """Values of trial `index` (0-based), or None when the strategy has none left."""
        raise NotImplementedError

    def tell(self, index: int, value: float | None) -> None:
        """Trial `index`'s final objective (None: it failed or reported none)."""

    def upfront(self) -> list[dict[str, Any]] | None:
        """Every trial's values, where they do not depend on results (Grid, Random); else None."""
        return None


class _Upfront(Strategy):
    """A strategy whose trials do not depend on results: each one is made when asked, and listed for a
    dry run."""

    def upfront(self) -> list[dict[str, Any]]:
        return [self.ask(i) for i in range(self.tuning.trial_count())]  # type: ignore[misc]


class GridStrategy(_Upfront):
    """Trial i is the i-th combination in itertools.product's order (the last name varies fastest),
    made when asked: a grid is never listed whole."""

    def __init__(self, tuning: TuningConfig, seed: int):
        super().__init__(tuning, seed)
        self.choices = {n: r.values for n, r in tuning.ranges.items()}  # type: ignore[union-attr]

    def ask(self, index: int) -> dict[str, Any] | None:
        if index >= self.tuning.trial_count():
            return None
        values = {}
        for name, choices in reversed(self.choices.items()):
            index, digit = divmod(index, len(choices))
            values[name] = choices[digit]
        return {name: values[name] for name in self.choices}


class RandomStrategy(_Upfront):
    """Each trial's values drawn when asked, in order, from one seeded generator: the same seed gives
    the same trials."""

    def __init__(self, tuning: TuningConfig, seed: int):
        super().__init__(tuning, seed)
        self.rng = random.Random(seed)
        self.drawn: list[dict[str, Any]] = []

    def ask(self, index: int) -> dict[str, Any] | None:
        if index >= self.tuning.trial_count():
            return None
        while len(self.drawn) <= index:
            self.drawn.append({n: sample(r, self.rng) for n, r in self.tuning.ranges.items()})
        return self.drawn[index]


def sample(spec, rng: random.Random) -> Any:
    """One value of a range, spread by its scaling."""
    if isinstance(spec, CategoricalRange):
        return rng.choice(spec.values)
    lo, hi = spec.min_value, spec.max_value
    if isinstance(spec, IntegerRange):
        if spec.scaling_type == "Logarithmic":  # log-uniform over [lo, hi + 1), floored: each integer's share
            return min(int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))), hi)
        return rng.randint(lo, hi)
    if spec.scaling_type == "Logarithmic":
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if spec.scaling_type == "ReverseLogarithmic":
        return 1.0 - math.exp(rng.uniform(math.log(1.0 - hi), math.log(1.0 - lo)))
    return rng.uniform(lo, hi)


class BayesianStrategy(Strategy):
    """Optuna's TPE sampler through its ask-and-tell interface, seeded."""

    def __init__(self, tuning: TuningConfig, seed: int):
        super().__init__(tuning, seed)
        import optuna  # only for a Bayesian sweep: Optuna loads SQLAlchemy and Alembic

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep's log says what it chose
        self._optuna = optuna
        direction = "minimize" if tuning.objective.type == "Minimize" else "maximize"
        self.study = optuna.create_study(direction=direction, sampler=optuna.samplers.TPESampler(seed=seed))
        self.asked: dict[int, Any] = {}

    def ask(self, index: int) -> dict[str, Any] | None:
        if index >= self.tuning.trial_count():
            return None
        trial = self.study.ask()
        self.asked[index] = trial
        return {name: self._suggest(trial, name, spec) for name, spec in self.tuning.ranges.items()}

    @staticmethod
    def _suggest(trial, name: str, spec) -> Any:
        if isinstance(spec, CategoricalRange):
            return trial.suggest_categorical(name, spec.values)
        log = spec.scaling_type == "Logarithmic"
        if isinstance(spec, IntegerRange):
            return trial.suggest_int(name, spec.min_value, spec.max_value, log=log)
        if spec.scaling_type == "ReverseLogarithmic":  # 1 - x log-uniform: dense near max_value
            return 1.0 - trial.suggest_float(f"1-{name}", 1.0 - spec.max_value, 1.0 - spec.min_value, log=True)
        return trial.suggest_float(name, float(spec.min_value), float(spec.max_value), log=log)

    def tell(self, index: int, value: float | None) -> None:
        trial = self.asked.pop(index, None)
        if trial is None:
            return
        if value is None:
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, value)


STRATEGIES = {"Grid": GridStrategy, "Random": RandomStrategy, "Bayesian": BayesianStrategy}


def local_refusals(tuning: TuningConfig) -> list[Issue]:
    """What a sweep run here or on Slurm cannot do as asked (SageMaker can): refused, never ignored."""
    issues = []
    if tuning.strategy not in LOCAL_STRATEGIES:
        issues.append(Issue("tuning.strategy", tuning.strategy,
                            "runs on SageMaker only: a local or Slurm sweep has no Hyperband scheduler",
                            "use strategy Bayesian with early_stopping: Auto (the median rule), Random or Grid, "
                            "or backend sagemaker"))
    if tuning.warm_start is not None:
        issues.append(Issue("tuning.warm_start", tuning.warm_start.type,
                            "is not supported by local and Slurm sweeps yet", "remove warm_start, or use backend "
                            "sagemaker"))
    criteria = tuning.completion_criteria
    if criteria is not None and criteria.complete_on_convergence:
        issues.append(Issue("tuning.completion_criteria.complete_on_convergence", True,
                            "is SageMaker's own convergence test, which a local or Slurm sweep does not have",
                            "remove it, or use target_objective_value or max_jobs_not_improving"))
    return issues


def strategy_for(tuning: TuningConfig, seed: int) -> Strategy:
    issues = local_refusals(tuning)
    if issues:
        raise ConfigError(issues)
    return STRATEGIES[tuning.strategy](tuning, seed)

