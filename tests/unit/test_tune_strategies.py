"""How a local or Slurm sweep chooses its trials (launcher.tune.strategies): Grid enumerates every
combination, Random is seeded, within bounds and spreads values by their scaling, Bayesian
(Optuna's TPE) proposes within bounds and is seeded; what a local sweep cannot do is refused."""

from __future__ import annotations

import math
import re

import pytest

from launcher.config.tuning import TuningConfig
from launcher.tune.strategies import strategy_for
from launcher.wire.training.issues import ConfigError

OBJECTIVE = {"metric": "validation:loss", "type": "Minimize"}


def tuning(**fields) -> TuningConfig:
    return TuningConfig.model_validate({"objective": OBJECTIVE, **fields})


def drawn(config: TuningConfig, seed: int) -> list[dict]:
    strategy = strategy_for(config, seed)
    out = []
    while (values := strategy.ask(len(out))) is not None:
        out.append(values)
    return out


def test_grid_enumerates_every_combination_once():
    config = tuning(strategy="Grid", ranges={"lr": {"kind": "categorical", "values": [0.1, 0.01]},
                                             "seed": {"kind": "categorical", "values": [1, 2, 3]}})
    trials = drawn(config, seed=0)
    expected = [{"lr": 0.1, "seed": 1}, {"lr": 0.1, "seed": 2}, {"lr": 0.1, "seed": 3},
                {"lr": 0.01, "seed": 1}, {"lr": 0.01, "seed": 2}, {"lr": 0.01, "seed": 3}]
    assert sorted(map(str, trials)) == sorted(map(str, expected))
    assert strategy_for(config, 0).upfront() == trials
    # control: max_jobs below the grid's size takes that many distinct combinations
    few = drawn(tuning(strategy="Grid", max_jobs=4, ranges=config.model_dump()["ranges"]), seed=0)
    assert len(few) == 4 and len({str(t) for t in few}) == 4


def _categories(count: int, size: int) -> dict:
    return {f"p{i}": {"kind": "categorical", "values": list(range(size))} for i in range(count)}


@pytest.mark.parametrize(("fields", "why"), [
    ({"strategy": "Grid", "ranges": _categories(30, 30)}, "Grid over 205891132094649000000000000000000000000000000 "
                                                          "combinations: SageMaker runs at most 750"),
    ({"strategy": "Grid", "ranges": _categories(2, 28)}, "Grid over 784 combinations"),
    ({"strategy": "Random", "max_jobs": 1_000_000_000, "ranges": _categories(1, 2)}, "less than or equal to 10000"),
    ({"strategy": "Bayesian", "max_jobs": 751, "ranges": _categories(1, 2)}, "at most 750 trials in a Bayesian"),
    ({"strategy": "Random", "max_jobs": 4, "max_parallel_jobs": 101, "ranges": _categories(1, 2)},
     "less than or equal to 100"),
])
def test_a_sweep_is_bounded_by_sagemakers_limits(fields, why):
    with pytest.raises(ValueError, match=why):
        tuning(**fields)


def test_trials_are_made_when_asked_up_to_the_limits():
    grid = tuning(strategy="Grid", ranges=_categories(2, 25) | {"p2": {"kind": "categorical", "values": [0]}})
    assert grid.trial_count() == 625  # control: a grid within the limit
    assert strategy_for(grid, 0).ask(624) == {"p0": 24, "p1": 24, "p2": 0}  # itertools.product's last
    assert strategy_for(grid, 0).ask(625) is None
    many = strategy_for(tuning(strategy="Random", max_jobs=10_000, ranges=_categories(1, 2)), 0)
    assert many.ask(0) is not None and len(many.drawn) == 1  # one trial drawn, not ten thousand


def test_random_is_seeded_and_within_bounds():
    config = tuning(strategy="Random", max_jobs=50, ranges={
        "lr": {"kind": "continuous", "min_value": 0.001, "max_value": 0.1},
        "layers": {"kind": "integer", "min_value": 2, "max_value": 5},
        "opt": {"kind": "categorical", "values": ["adam", "sgd"]}})
    first, again, other = drawn(config, 7), drawn(config, 7), drawn(config, 8)
    assert first == again
    assert first != other  # control: another seed draws other values
    assert all(0.001 <= t["lr"] <= 0.1 and isinstance(t["lr"], float) for t in first)
    assert all(2 <= t["layers"] <= 5 and isinstance(t["layers"], int) for t in first)
    assert {t["layers"] for t in first} == {2, 3, 4, 5} and {t["opt"] for t in first} == {"adam", "sgd"}


def _share(config: TuningConfig, below) -> float:
    values = [t["x"] for t in drawn(config, 3)]
    return sum(below(v) for v in values) / len(values)


N = 2000
# the share of N draws in a region of probability p has a standard deviation sqrt(p(1-p)/N) <= 0.011:
# 0.05 is over four of them, and the scalings below differ by 0.4 or more
TOL = 0.05


def test_random_honours_logarithmic_scaling():
    ranges = {"x": {"kind": "continuous", "min_value": 1e-5, "max_value": 1e-1}}
    log = tuning(strategy="Random", max_jobs=N, ranges={"x": {**ranges["x"], "scaling_type": "Logarithmic"}})
    linear = tuning(strategy="Random", max_jobs=N, ranges={"x": {**ranges["x"], "scaling_type": "Linear"}})
    # below 1e-3: half of the log range's decades, 1 % of its length
    assert abs(_share(log, lambda v: v < 1e-3) - 0.5) < TOL
    assert abs(_share(linear, lambda v: v < 1e-3) - (1e-3 - 1e-5) / (1e-1 - 1e-5)) < TOL


def test_random_honours_reverse_logarithmic_scaling():
    x = {"kind": "continuous", "min_value": 0.9, "max_value": 0.999}
    reverse = tuning(strategy="Random", max_jobs=N, ranges={"x": {**x, "scaling_type": "ReverseLogarithmic"}})
    linear = tuning(strategy="Random", max_jobs=N, ranges={"x": {**x, "scaling_type": "Linear"}})
    # above 0.99, 1 - x lies in [0.001, 0.01): half of 1 - x's decades, 9 % of the range's length
    assert abs(_share(reverse, lambda v: v > 0.99) - 0.5) < TOL
    assert abs(_share(linear, lambda v: v > 0.99) - (0.999 - 0.99) / (0.999 - 0.9)) < TOL
    assert all(0.9 <= t["x"] <= 0.999 for t in drawn(reverse, 3))


def test_random_integer_logarithmic_stays_within_bounds():
    config = tuning(strategy="Random", max_jobs=500, ranges={
        "n": {"kind": "integer", "min_value": 1, "max_value": 1000, "scaling_type": "Logarithmic"}})
    values = [t["n"] for t in drawn(config, 1)]
    assert min(values) >= 1 and max(values) <= 1000 and all(isinstance(v, int) for v in values)
    assert abs(sum(v < 32 for v in values) / len(values) - math.log(32) / math.log(1001)) < 0.1


def test_bayesian_proposes_within_bounds_and_is_seeded():
    pytest.importorskip("optuna")
    config = tuning(strategy="Bayesian", max_jobs=12, ranges={
        "lr": {"kind": "continuous", "min_value": 1e-4, "max_value": 1e-1, "scaling_type": "Logarithmic"},
        "beta": {"kind": "continuous", "min_value": 0.9, "max_value": 0.999, "scaling_type": "ReverseLogarithmic"},
        "layers": {"kind": "integer", "min_value": 2, "max_value": 8},
        "opt": {"kind": "categorical", "values": ["adam", "sgd"]}})

    def run(seed: int) -> list[dict]:
        strategy, out = strategy_for(config, seed), []
        while (values := strategy.ask(len(out))) is not None:
            out.append(values)
            strategy.tell(len(out) - 1, (math.log10(values["lr"]) + 2.5) ** 2 if values["opt"] == "adam" else None)
        return out

    trials = run(5)
    assert len(trials) == 12
    for t in trials:
        assert 1e-4 <= t["lr"] <= 1e-1 and 0.9 <= t["beta"] <= 0.999
        assert 2 <= t["layers"] <= 8 and isinstance(t["layers"], int) and t["opt"] in ("adam", "sgd")
    assert run(5) == trials
    assert run(6) != trials  # control: the seed is what makes it reproducible


@pytest.mark.parametrize(("fields", "field"), [
    ({"strategy": "Hyperband", "max_jobs": 4}, "tuning.strategy"),
    ({"strategy": "Random", "max_jobs": 4, "warm_start": {"parents": ["old"], "type": "TransferLearning"}},
     "tuning.warm_start"),
    ({"strategy": "Random", "max_jobs": 4, "completion_criteria": {"complete_on_convergence": True}},
     "tuning.completion_criteria.complete_on_convergence"),
])
def test_what_a_local_sweep_cannot_do_is_refused_by_name(fields, field):
    config = tuning(ranges={"lr": {"kind": "continuous", "min_value": 0.001, "max_value": 0.1}}, **fields)
    with pytest.raises(ConfigError) as caught:
        strategy_for(config, 0)
    assert [i.path for i in caught.value.issues] == [field]
    # control: the same sweep as a plain Random one is accepted
    plain = tuning(strategy="Random", max_jobs=4, ranges={"lr": {"kind": "continuous", "min_value": 0.001,
                                                                 "max_value": 0.1}})
    assert strategy_for(plain, 0).ask(0) is not None


@pytest.mark.parametrize(("strategy", "spec", "why"), [
    ("Random", {"kind": "integer", "min_value": 1, "max_value": 10**400, "scaling_type": "Logarithmic"},
     "max_value 1000000000000"),
    ("Bayesian", {"kind": "continuous", "min_value": -1e308, "max_value": 1e308},
     "min_value -1e+308 is beyond +-1e+300"),
    ("Bayesian", {"kind": "integer", "min_value": 0, "max_value": 2**53}, "is beyond +-1099511627776"),
])
def test_ranges_are_bounded_to_what_the_samplers_draw_from(strategy, spec, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        tuning(strategy=strategy, max_jobs=12, ranges={"x": spec})


@pytest.mark.parametrize("strategy", ["Random", "Bayesian"])
@pytest.mark.filterwarnings("error")  # Optuna's numerical warnings (an underflow past the bounds) too
def test_the_widest_ranges_allowed_are_sampled(strategy):  # control: the bounds above hold for every sampler
    config = tuning(strategy=strategy, max_jobs=12, ranges={
        "f": {"kind": "continuous", "min_value": -1e300, "max_value": 1e300},
        "i": {"kind": "integer", "min_value": -2**40, "max_value": 2**40},
        "li": {"kind": "integer", "min_value": 1, "max_value": 2**40, "scaling_type": "Logarithmic"},
        "lf": {"kind": "continuous", "min_value": 1e-300, "max_value": 1e300, "scaling_type": "Logarithmic"}})
    strategy_ = strategy_for(config, 1)
    for index in range(12):
        values = strategy_.ask(index)
        assert -1e300 <= values["f"] <= 1e300 and 1 <= values["li"] <= 2**40 and 1e-300 <= values["lf"] <= 1e300
        strategy_.tell(index, abs(values["f"]) / 1e300)
