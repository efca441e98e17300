"""The step watchdog's arithmetic (container/resilience/step_watch.py): which deadline holds when,
what a step's time is, and what an expiry leaves. The multi-rank run is in
tests/integration/test_hangs.py."""

from __future__ import annotations

import json
import threading
import time

import pytest
from pydantic import ValidationError

from container.resilience import step_watch
from container.resilience.step_watch import Limits, StepWatch
from launcher.config import TrainingHyperparameters
from launcher.wire import diagnostics
from launcher.wire.faults import EXIT_HUNG, FAULT_DIR_ENV, HUNG_EXCEPTION
from launcher.wire.training.hyperparameters import INIT_TIMEOUT_DEFAULT_S, STEP_TIMEOUT_FLOOR_S, STEP_TIMEOUT_MEDIANS
from tests.support.config_checks import issues_of, only_issue
from tests.unit.test_config_rules import make_job


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_defaults_and_off():
    assert Limits.of(TrainingHyperparameters()) == Limits(init_s=INIT_TIMEOUT_DEFAULT_S, step_s=None)
    off = Limits.of(TrainingHyperparameters(init_timeout=0, step_timeout=0))
    assert off.init()[0] is None and off.step([1.0, 2.0]) == (None, "off")
    assert Limits.of(TrainingHyperparameters(step_timeout=7)).step([100.0])[0] == 7  # the job's value wins


def test_the_default_step_limit_is_a_multiple_of_the_median_with_a_floor():
    limits = Limits(init_s=300, step_s=None)
    fast = [0.2, 0.3, 50.0]  # one slow step (a GC pause, a tracker's call) does not move the median
    assert limits.step(fast)[0] == STEP_TIMEOUT_FLOOR_S
    slow = [20.0, 30.0, 25.0, 400.0]  # median 27.5 s
    limit, source = limits.step(slow)
    assert limit == STEP_TIMEOUT_MEDIANS * 27.5 and "median step 27.5 s of the last 4" in source
    # no step timed yet: the step after the first still gets init_timeout (warm-up)
    assert limits.step([]) == (300, "init_timeout 300 s, for the step after the first, none timed yet")


def test_deadlines_follow_steps_and_sections_are_timed_on_their_own(tmp_path):
    clock = Clock()
    watch = StepWatch(Limits(init_s=500, step_s=None), tmp_path, 0, 1, "h", clock=clock)
    assert watch.deadline.at == 1500 and watch.deadline.what == "initialization"
    clock.now += 400  # initialization and step 1: not a step time
    watch.step_done(1)
    assert list(watch.times) == [] and watch.deadline.at == clock.now + 500
    clock.now += 2
    watch.step_done(2)
    assert list(watch.times) == [2] and watch.deadline == step_watch.Deadline(
        clock.now + STEP_TIMEOUT_FLOOR_S, clock.now, "step 3", STEP_TIMEOUT_FLOOR_S, watch.limits.step([2])[1])
    with watch.section("checkpoint save"):
        assert watch.deadline.at == clock.now + 500 and watch.deadline.what == "checkpoint save after step 2"
        clock.now += 450  # far beyond the step limit, within init_timeout
        assert watch.expired(clock.now) is None
    clock.now += 3
    watch.step_done(3)
    assert list(watch.times) == [2, 3]  # the save is not part of step 3's time
    assert watch.expired(clock.now + STEP_TIMEOUT_FLOOR_S - 0.01) is None
    assert watch.expired(clock.now + STEP_TIMEOUT_FLOOR_S).what == "step 4"


def test_an_expired_step_writes_the_stacks_and_leaves_with_exit_hung(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path / "faults"))
    monkeypatch.setenv("RANK", "3")
    (tmp_path / "faults").mkdir()
    left = []
    watch = StepWatch(Limits(init_s=30, step_s=0.3), tmp_path / "diag", 3, 4, "algo-2",
                      leave=left.append, grace_s=0.0)
    watch.step_done(1)
    watch.start()
    for step in range(2, 8):  # control: steps within the limit never expire
        time.sleep(0.05)
        watch.step_done(step)
    assert left == [] and not (tmp_path / "diag").exists()
    deadline = time.monotonic() + 20
    while not left and time.monotonic() < deadline:
        _hung_here()
    assert left == [EXIT_HUNG]
    stacks = diagnostics.read_rank_file(tmp_path / "diag" / "rank-3.txt")
    assert (stacks.rank, stacks.world, stacks.host) == (3, 4, "algo-2")
    assert stacks.fields["reason"].startswith("step 8 did not complete within 0.3 s (step_timeout 0.3 s, set by")
    assert stacks.fields["last completed step"] == "7"
    assert any(frame.function == "_hung_here" for frame in stacks.main) and not stacks.waiting
    record = json.loads((tmp_path / "faults" / "rank-3.json").read_text())
    assert record["exception"] == HUNG_EXCEPTION and record["collective"] is False
    # the hang ends (a frozen peer continued) before the exit: the rank trains and saves no more, so
    # no checkpoint lies past the step its failure record names (the controls: the steps above)
    saved = []
    with pytest.raises(SystemExit) as leaving:
        with watch.section("checkpoint save"):
            saved.append(8)
    with pytest.raises(SystemExit):
        watch.step_done(8)
    assert leaving.value.code == EXIT_HUNG and saved == [] and watch.step == 7


def _hung_here():
    time.sleep(0.05)


def test_the_watch_is_stopped_without_expiring(tmp_path):
    left = []
    watch = StepWatch(Limits(init_s=0.2, step_s=None), tmp_path, 0, 1, "h", leave=left.append, grace_s=0).start()
    watch.stop()
    time.sleep(0.4)  # past init_s: a watch still running would have expired by now
    assert left == [] and not any(tmp_path.iterdir())
    for thread in threading.enumerate():  # the thread ends (a loaded machine may take it a moment)
        if thread.name == "smlaunch-step-watch":
            thread.join(timeout=10)
    assert not any(t.name == "smlaunch-step-watch" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("field", ["init_timeout", "step_timeout"])
@pytest.mark.parametrize("value", [-1, 86401, 1.5, "soon"])
def test_timeouts_are_validated(field, value):
    with pytest.raises(ValidationError) as info:
        TrainingHyperparameters(**{field: value})
    assert field in str(info.value)
    assert getattr(TrainingHyperparameters(**{field: 0}), field) == 0  # control: 0 turns the watch off


def test_validate_says_when_the_step_timeout_cannot_work(runtime_dir, user_script_dir):
    """At or above collective_timeout the waiting ranks fail first, with a collective's error; a script
    of the user's own has no watchdog at all."""
    at_default = only_issue(make_job(runtime_dir, hp={"step_timeout": 600}), "hyperparameters.step_timeout",
                            "warning")[0]
    assert "not below collective_timeout (600 s by default)" in at_default.problem
    above = only_issue(make_job(runtime_dir, hp={"step_timeout": 300, "collective_timeout": 120}),
                       "hyperparameters.step_timeout", "warning")[0]
    assert "not below collective_timeout (120 s)" in above.problem and "below 120" in above.fix
    own = make_job(user_script_dir, hp={"step_timeout": 30, "init_timeout": 60},
                   image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1")
    for field in ("step_timeout", "init_timeout"):
        assert "a script of your own has none" in only_issue(own, f"hyperparameters.{field}", "warning")[0].problem
    # controls: below the collectives' timeout, or off, the runtime's watchdog is left to do its work
    for hp in ({"step_timeout": 599}, {"step_timeout": 0}, {"step_timeout": 900, "collective_timeout": 1200}, {}):
        assert not [i for i in issues_of(make_job(runtime_dir, hp=hp), "warning") if "timeout" in i.path], hp
