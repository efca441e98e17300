"""Early stopping Auto: SageMaker's median rule (launcher.tune.median)."""

from __future__ import annotations

from launcher.tune.median import MIN_EARLIER, median_stop, running_average


def test_running_average_is_up_to_the_step():
    series = [(1, 4.0), (2, 2.0), (3, 0.0)]
    assert running_average(series, 2) == 3.0
    assert running_average(series, 10) == 2.0
    assert running_average(series, 0.5) is None


EARLIER = [[(1, 3.0), (2, 1.0)], [(1, 5.0), (2, 3.0)], [(1, 7.0), (2, 5.0)]]  # averages at 2: 2, 4, 6


def test_a_trial_worse_than_the_median_is_stopped_and_a_better_one_is_not():
    assert median_stop([(1, 6.0), (2, 4.5)], EARLIER, minimize=True) is not None  # 4.5 > median 4
    assert median_stop([(1, 6.0), (2, 3.5)], EARLIER, minimize=True) is None  # control: 3.5 < 4
    # maximizing, the same values compare the other way
    assert median_stop([(1, 6.0), (2, 3.5)], EARLIER, minimize=False) is not None
    assert median_stop([(1, 6.0), (2, 4.5)], EARLIER, minimize=False) is None


def test_the_median_is_taken_at_the_trials_own_step():
    # at step 1 the earlier trials' averages are 3, 5, 7: 4.5 is better than the median 5
    assert median_stop([(1, 4.5)], EARLIER, minimize=True) is None
    assert median_stop([(1, 5.5)], EARLIER, minimize=True) is not None


def test_too_few_earlier_trials_stop_nothing():
    assert MIN_EARLIER == 3
    assert median_stop([(2, 100.0)], EARLIER[:2], minimize=True) is None
    assert median_stop([(2, 100.0)], EARLIER, minimize=True) is not None  # control: with the third
    assert median_stop([], EARLIER, minimize=True) is None
