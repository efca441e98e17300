"""The sweep engine (launcher.tune.controller, .sweep, .state, .describe) driven against a backend
that runs nothing: each trial's outcome and metric records are the test's own. A failed trial is
recorded and the sweep goes on; a sweep whose every trial failed fails with the first reason; the
median rule stops a trial through the backend's stop; the state file and its description; stop
signals only the controller recorded. Real jobs: tests/integration/test_tune.py."""

from __future__ import annotations

import json
import os
import stat

import pytest

from launcher.backends.base import TERMINAL_STATUSES, BackendError
from launcher.backends.metric_records import JOBDIR_METRICS
from launcher.config import JobConfig
from launcher.config.tuning import TuningConfig
from launcher.local import identity, store
from launcher.local.spec import STOP_REASON
from launcher.tune import controller, state
from launcher.tune.sweep import SweepHandle, start_sweep
from tests.support.local_jobs import HP
from tests.support.train_runs import ROOT

JOB = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
       "instance_count": 1, "processes_per_host": 1, "distribution": {"torch_distributed": {"enabled": True}},
       "hyperparameters": HP}


class FakeBackend:
    """Trials whose outcome is set by their lr: (status at first look, validation losses by step, reason)."""

    name, root = "local", None

    def __init__(self, outcomes: dict[float, tuple[str, list[float], str]]):
        self.outcomes, self.jobs, self.stopped = outcomes, {}, []

    def submit(self, job, job_name, *, detach=False):
        lr = job.config.hyperparameters.lr
        status, losses, reason = self.outcomes[lr]
        directory = store.job_dir(job_name)
        (directory / JOBDIR_METRICS).parent.mkdir(parents=True)
        (directory / JOBDIR_METRICS).write_text("".join(
            json.dumps({"step": 10 * (i + 1), "val_loss": v}) + "\n" for i, v in enumerate(losses)))
        self.jobs[job_name] = {"TrainingJobName": job_name, "TrainingJobStatus": status, "LocalJobDir": str(directory),
                               "FailureReason": reason or None, "HyperParameters": {"lr": lr}}
        return job_name

    def describe(self, name):
        return self.jobs[name]

    def stop(self, name):
        if self.jobs[name]["TrainingJobStatus"] in TERMINAL_STATUSES:
            raise BackendError(f"{name} has already ended")
        self.stopped.append(name)
        reason = (store.job_dir(name) / STOP_REASON).read_text().strip()
        self.jobs[name].update(TrainingJobStatus="Stopped", StopReason=reason)


def run(home, monkeypatch, outcomes, **tuning) -> tuple[SweepHandle, FakeBackend]:
    backend = FakeBackend(outcomes)
    monkeypatch.setattr(controller.registry, "backend_named", lambda *a, **k: backend)
    config = TuningConfig.model_validate({"objective": {"metric": "validation:loss", "type": "Minimize"},
                                          "strategy": "Grid", "max_parallel_jobs": 2,
                                          "ranges": {"lr": {"kind": "categorical", "values": list(outcomes)}},
                                          **tuning})
    handle = start_sweep(JobConfig.model_validate(JOB), config, name="s1", poll=0)
    return handle, backend


def test_a_failed_trial_is_recorded_and_the_sweep_goes_on(home, monkeypatch):
    handle, _ = run(home, monkeypatch, {0.01: ("Completed", [5.0, 4.0], ""),
                                        0.02: ("Failed", [5.0], "AlgorithmError: out of memory"),
                                        0.03: ("Completed", [5.0, 3.5], "")})
    desc = handle.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Completed"
    trials = {t["TunedHyperParameters"]["lr"]: t for t in desc["TrainingJobs"]}
    assert trials["0.02"]["TrainingJobStatus"] == "Failed"
    assert trials["0.02"]["FailureReason"] == "AlgorithmError: out of memory"
    assert trials["0.02"]["ObjectiveStatus"] == "Failed"
    assert "FinalHyperParameterTuningJobObjectiveMetric" not in trials["0.02"]
    assert trials["0.01"]["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == 4.0  # the last value
    assert desc["BestTrainingJob"]["TrainingJobName"] == trials["0.03"]["TrainingJobName"]
    assert desc["TrainingJobStatusCounters"] == {"Completed": 2, "InProgress": 0, "RetryableError": 0,
                                                 "NonRetryableError": 1, "Stopped": 0}
    assert desc["ObjectiveStatusCounters"] == {"Succeeded": 2, "Pending": 0, "Failed": 1}
    assert handle.best_trial()["TunedHyperParameters"] == {"lr": "0.03"}


def test_a_sweep_whose_every_trial_failed_fails_with_the_first_reason(home, monkeypatch):
    handle, _ = run(home, monkeypatch, {0.01: ("Failed", [], "AlgorithmError: first"),
                                        0.02: ("Failed", [], "AlgorithmError: second")})
    desc = handle.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Failed"
    assert desc["FailureReason"] == "every trial failed; the first, s1-001: AlgorithmError: first"
    assert "BestTrainingJob" not in desc


def test_the_median_rule_stops_a_worse_running_trial_through_the_backend(home, monkeypatch):
    good = [6.0, 5.0, 4.0]  # running averages at step 20: 5.5 each
    outcomes = {0.01: ("Completed", good, ""), 0.02: ("Completed", good, ""), 0.03: ("Completed", good, ""),
                0.04: ("InProgress", [6.0, 5.9], ""),  # 5.9 at step 20 is worse than 5.5: stopped
                0.05: ("InProgress", [6.0, 5.0], "")}  # control: 5.0 is better: runs on
    backend = FakeBackend(outcomes)
    monkeypatch.setattr(controller.registry, "backend_named", lambda *a, **k: backend)
    looks: dict[str, int] = {}
    original = backend.describe

    def describe(name):  # the running control ends after the median rule has had two looks at it
        looks[name] = looks.get(name, 0) + 1
        record = original(name)
        if name == "s2-005" and looks[name] > 4:
            record["TrainingJobStatus"] = "Completed"
        return record

    backend.describe = describe
    config = TuningConfig.model_validate({"objective": {"metric": "validation:loss", "type": "Minimize"},
                                          "strategy": "Grid", "max_parallel_jobs": 1, "early_stopping": "Auto",
                                          "ranges": {"lr": {"kind": "categorical", "values": list(outcomes)}}})
    handle = start_sweep(JobConfig.model_validate(JOB), config, name="s2", poll=0)
    trials = {t["TunedHyperParameters"]["lr"]: t for t in handle.describe()["TrainingJobs"]}
    assert backend.stopped == ["s2-004"]
    assert trials["0.04"]["TrainingJobStatus"] == "Stopped" and "median" in trials["0.04"]["EarlyStopped"]
    assert backend.jobs["s2-004"]["StopReason"].startswith("Stopped by early stopping (the median rule)")
    assert trials["0.05"]["TrainingJobStatus"] == "Completed" and "EarlyStopped" not in trials["0.05"]


def test_the_state_file_is_private_and_atomic_and_a_damaged_one_is_said(home):
    directory = state.sweep_dir("s3")
    state.write(directory, {"HyperParameterTuningJobName": "s3", "Status": "InProgress", "Trials": []})
    assert stat.S_IMODE((directory / state.STATE).stat().st_mode) == 0o600
    assert [p.name for p in directory.iterdir()] == [state.STATE]  # no temporary file left beside it
    assert state.read("s3")["Status"] == "InProgress"
    (directory / state.STATE).write_text('{"Status": "InProgress"}')
    with pytest.raises(state.DamagedSweep, match="not a sweep record"):
        state.read("s3")
    with pytest.raises(LookupError, match="no tuning job named 'nope'"):
        state.read("nope")


def test_stop_signals_only_the_recorded_controller_and_a_dead_one_fails_the_sweep(home):
    directory = state.sweep_dir("s4")
    me = identity.of(os.getpid())
    assert identity.is_running(me)  # control: the identity of a live process is recognized
    gone = {**me, "StartTicks": me["StartTicks"] + 1}  # this pid, another process's start: not ours
    state.write(directory, {"HyperParameterTuningJobName": "s4", "Status": "InProgress", "Trials": [],
                            "ControllerProcess": gone})
    handle = SweepHandle("s4")
    assert handle.state()["Status"] == "Failed"
    assert "controller ended without an outcome" in state.read("s4")["FailureReason"]
    with pytest.raises(BackendError, match="already ended"):
        handle.stop()
