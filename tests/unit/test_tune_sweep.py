"""The sweep engine (launcher.tune.controller, .sweep, .state, .describe) driven against a backend
that runs nothing: each trial's outcome and metric records are the test's own. A failed trial is
recorded and the sweep goes on; a sweep whose every trial failed fails with the first reason; the
median rule stops a trial through the backend's stop; the state file and its description; stop
signals only the controller recorded. Real jobs: tests/integration/test_tune.py."""

from __future__ import annotations

import json
import os
import re
import signal
import stat

import pytest

from launcher.backends import jobmetrics
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

    def job_dir(self, name):
        return store.job_dir(name)

    def metrics(self, name, logs=None):  # a local job's: the job directory's records
        return jobmetrics.from_job_dir(self, name, logs)

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


def record(name: str, **fields) -> dict:
    """A sweep's state as start_sweep writes it, before its controller has recorded itself."""
    return {"HyperParameterTuningJobName": name, "Status": "InProgress", "Backend": "local", "RandomSeed": 1,
            "Tuning": {"objective": {"metric": "validation:loss", "type": "Minimize"}}, "Trials": [],
            "CreationTime": store.now(), **fields}


def test_the_state_file_is_private_and_atomic_and_a_damaged_one_is_said(home):
    directory = state.sweep_dir("s3")
    state.write(directory, record("s3"))
    assert stat.S_IMODE((directory / state.STATE).stat().st_mode) == 0o600
    assert [p.name for p in directory.iterdir()] == [state.STATE]  # no temporary file left beside it
    assert state.read("s3")["Status"] == "InProgress"
    (directory / state.STATE).write_text('{"Status": "InProgress"}')
    with pytest.raises(state.DamagedSweep, match="no HyperParameterTuningJobName"):
        state.read("s3")
    with pytest.raises(LookupError, match="no tuning job named 'nope'"):
        state.read("nope")


def test_stop_signals_only_the_recorded_controller_and_a_dead_one_fails_the_sweep(home):
    directory = state.sweep_dir("s4")
    me = identity.of(os.getpid())
    assert identity.is_running(me)  # control: the identity of a live process is recognized
    gone = {**me, "StartTicks": me["StartTicks"] + 1}  # this pid, another process's start: not ours
    state.write(directory, record("s4", ControllerProcess=gone))
    handle = SweepHandle("s4")
    assert handle.state()["Status"] == "Failed"
    assert "controller ended without an outcome" in state.read("s4")["FailureReason"]
    with pytest.raises(BackendError, match="already ended"):
        handle.stop()


@pytest.mark.parametrize(("controller", "why"), [
    ("abc", "ControllerProcess is str 'abc', not a process identity"),
    ([1, 2], "ControllerProcess is list '[1, 2]', not a process identity"),
    ({"Pid": 10**30}, "not a process id"),
    ({"Pid": -1}, "not a process id"),
    ({"Pid": True}, "not a process id"),
    ({"Pid": os.getpid()}, "a pid without the process's start time and boot id"),  # this very process: not trusted
])
def test_a_damaged_controller_identity_is_named_and_the_other_sweeps_are_listed(home, controller, why):
    state.write(state.sweep_dir("bad"), record("bad", ControllerProcess=controller))
    state.write(state.sweep_dir("good"), record("good", ControllerProcess=identity.of(os.getpid())))  # control
    received = []
    previous = signal.signal(signal.SIGTERM, lambda *args: received.append(args))  # were this process signalled
    try:
        with pytest.raises(state.DamagedSweep, match=f"bad/sweep.json is damaged: .*{re.escape(why)}"):
            SweepHandle("bad").stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == []  # nothing signalled: the record is refused before anything is done
    found, damaged = state.list_sweeps()
    assert [s["HyperParameterTuningJobName"] for s in found] == ["good"]
    assert len(damaged) == 1 and why in damaged[0]


@pytest.mark.parametrize(("fields", "why"), [
    ({"Trials": [{"TrainingJobName": "x-001", "TrainingJobStatus": "InProgress", "TunedHyperParameters": {},
                  "Objective": [[1, "a"]]}]}, "Trials[0] Objective is not a list of [step, value] pairs"),
    ({"Trials": ["x"]}, "Trials[0] is not an object"),
    ({"Tuning": {}}, "Tuning has no objective"),
    ({"Status": "Running"}, 'Status is "Running"'),
    ({"HyperParameterTuningJobName": "other"}, 'it names tuning job "other", not bad'),
    ({"CreationTime": "yesterday"}, 'CreationTime is "yesterday", not a time'),
])
def test_a_sweep_record_the_commands_cannot_read_is_damaged(home, fields, why):
    state.write(state.sweep_dir("bad"), record("bad", **fields))
    with pytest.raises(state.DamagedSweep, match=re.escape(why)):
        state.read("bad")


def test_a_sweep_whose_controller_was_killed_has_its_running_trials_stopped(home, monkeypatch):
    backend = FakeBackend({})
    monkeypatch.setattr(controller.registry, "backend_named", lambda *a, **k: backend)
    for name, status in (("s5-001", "InProgress"), ("s5-002", "Completed")):
        store.job_dir(name).mkdir(parents=True)
        backend.jobs[name] = {"TrainingJobName": name, "TrainingJobStatus": status}
    trials = [{"TrainingJobName": n, "TrainingJobStatus": "InProgress", "TunedHyperParameters": {"lr": 0.1},
               "Handle": f"local:{n}"} for n in ("s5-001", "s5-002")]
    me = identity.of(os.getpid())
    state.write(state.sweep_dir("s5"), record("s5", Trials=trials, ControllerProcess={**me, "StartTicks": 0}))
    said = SweepHandle("s5").stop()
    assert backend.stopped == ["s5-001"]  # the one still running; the one that ended (control) is left alone
    assert "stopped its running trial(s) s5-001" in said
    after = state.read("s5")
    assert after["Status"] == "Failed"
    assert [t["TrainingJobStatus"] for t in after["Trials"]] == ["Stopped", "Completed"]
    assert backend.jobs["s5-001"]["StopReason"].startswith("Stopped with its tuning job: the sweep's controller "
                                                            "ended without an outcome")


def test_a_controller_that_fails_before_its_first_trial_leaves_the_sweep_failed(home, monkeypatch):
    def no_strategy(*args):
        raise MemoryError("the strategy could not be made")

    monkeypatch.setattr(controller, "strategy_for", no_strategy)
    monkeypatch.setattr(controller.registry, "backend_named", lambda *a, **k: FakeBackend({}))
    config = TuningConfig.model_validate({"objective": {"metric": "validation:loss", "type": "Minimize"},
                                          "strategy": "Grid", "ranges": {"lr": {"kind": "categorical",
                                                                                "values": [0.1]}}})
    handle = start_sweep(JobConfig.model_validate(JOB), config, name="s6", poll=0)
    desc = handle.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Failed"
    assert desc["FailureReason"] == "the sweep's controller failed: MemoryError: the strategy could not be made"
    assert "Traceback" in (state.sweep_dir("s6") / state.LOG).read_text()  # for whoever debugs it, not the user


def test_a_sweep_whose_controller_never_recorded_itself_fails(home):
    state.write(state.sweep_dir("s7"), record("s7", CreationTime="2020-01-01T00:00:00.000+00:00"))
    state.write(state.sweep_dir("s8"), record("s8"))  # control: created just now, its controller is starting
    assert SweepHandle("s7").state()["Status"] == "Failed"
    assert "no controller recorded itself within 30 s" in state.read("s7")["FailureReason"]
    assert SweepHandle("s8").state()["Status"] == "InProgress"


class LogBackend(FakeBackend):
    """Trials of a script of the user's own: their objective is in their log, by metric_definitions."""

    def submit(self, job, job_name, *, detach=False):
        directory = store.job_dir(job_name)
        (directory / "logs").mkdir(parents=True)
        (directory / "logs" / "job.log").write_text(self.outcomes[job.config.hyperparameters.lr][1])
        definitions = [m.model_dump() for m in job.config.metric_definitions]
        self.jobs[job_name] = {"TrainingJobName": job_name, "TrainingJobStatus": "InProgress",
                               "LocalJobDir": str(directory), "AlgorithmSpecification": {"MetricDefinitions":
                                                                                         definitions}}
        return job_name


def test_a_trial_whose_objective_regex_backtracks_is_stopped_and_failed_and_the_sweep_goes_on(home, monkeypatch):
    backend = LogBackend({0.01: ("", "algo-1 | acc=0.5\n" + "algo-1 | " + "x" * 3000 + "\n"),
                          0.02: ("", "algo-1 | acc=0.7\n")})  # control: its objective reads
    monkeypatch.setattr(controller.registry, "backend_named", lambda *a, **k: backend)
    original = backend.describe

    def describe(name):  # the control ends once its value has been read
        record = original(name)
        if name == "s9-002" and record["TrainingJobStatus"] == "InProgress" and name in looked:
            record["TrainingJobStatus"] = "Completed"
        looked.add(name)
        return record

    looked: set[str] = set()
    backend.describe = describe
    backtracks = {"Name": "acc", "Regex": r"acc=([0-9.]+)|((x+x+)+)y"}  # a line of x's without the y: 2^n tries
    job = JobConfig.model_validate({**JOB, "metric_definitions": [backtracks]})
    config = TuningConfig.model_validate({"objective": {"metric": "acc", "type": "Maximize"}, "strategy": "Grid",
                                          "max_parallel_jobs": 2,
                                          "ranges": {"lr": {"kind": "categorical", "values": [0.01, 0.02]}}})
    desc = start_sweep(job, config, name="s9", poll=0).describe()
    trials = {t["TrainingJobName"]: t for t in desc["TrainingJobs"]}
    assert backend.stopped == ["s9-001"]
    assert trials["s9-001"]["TrainingJobStatus"] == "Failed"
    assert "its objective acc cannot be read from its log: its Regex searched line 2" in trials["s9-001"][
        "FailureReason"]
    assert trials["s9-002"]["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == 0.7
    assert desc["HyperParameterTuningJobStatus"] == "Completed"


def test_a_stop_asked_for_during_a_round_ends_the_round(home, monkeypatch):
    backend = FakeBackend({})
    monkeypatch.setattr(controller.registry, "backend_named", lambda *a, **k: backend)
    names = [f"s10-00{i}" for i in (1, 2, 3)]
    backend.jobs = {n: {"TrainingJobName": n, "TrainingJobStatus": "InProgress", "LocalJobDir": str(home)}
                    for n in names}
    trials = [{"TrainingJobName": n, "TrainingJobStatus": "InProgress", "TunedHyperParameters": {"lr": 0.1},
               "Handle": f"local:{n}"} for n in names]
    state.write(state.sweep_dir("s10"), record("s10", Trials=trials, Tuning={
        "objective": {"metric": "validation:loss", "type": "Minimize"}, "strategy": "Random", "max_jobs": 3,
        "ranges": {"lr": {"kind": "continuous", "min_value": 0.01, "max_value": 0.1}}}))
    ctrl = controller.Controller(state.sweep_dir("s10"), poll=0)
    ctrl._prepare()
    looked = []

    def describe(name):  # `smlaunch stop` arrives while the controller reads its first trial
        looked.append(name)
        ctrl._on_sigterm(None, None)
        return backend.jobs[name]

    backend.describe = describe
    ctrl._refresh()
    assert set(looked) == {"s10-001"}  # the round ended there: the sweep winds down now, not after every trial
    ctrl._refresh(heed_stop=False)  # control: winding down, it waits for every trial
    assert set(looked) == set(names)
