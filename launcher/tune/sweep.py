"""Start, follow and stop a sweep run here or on Slurm: `start_sweep` and the `SweepHandle` it returns
(what the SDK tuner and `smlaunch tune` call for backend local or slurm).

A sweep's description has the shape of SageMaker's DescribeHyperParameterTuningJob (status,
counters, BestTrainingJob, ...), built from its state file (launcher.tune.state) by
launcher.tune.describe; its trials are ordinary jobs of the backend (`smlaunch status/logs/metrics`).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from launcher.backends import registry
from launcher.backends.base import BackendError
from launcher.config import JobConfig, backend_table, validate_job
from launcher.config.tuning import TuningConfig
from launcher.local import identity, store
from launcher.tune import state as sweep_state
from launcher.tune.controller import Controller
from launcher.tune.describe import best_summary, describe_state
from launcher.tune.strategies import local_refusals
from launcher.tune.trials import base_job_data, check_sweep_name, stop_trial, sweep_name
from launcher.wire.training.issues import ConfigError, Issue

CONTROLLER_START_S = 30.0  # how long a detached start waits for its controller to record itself


def start_sweep(job: JobConfig, tuning: TuningConfig, *, name: str | None = None, wait: bool = True,
                base_dir: str | Path | None = None,
                printer: Callable[[str], None] | None = None, poll: float = 2.0) -> SweepHandle:
    """Start a sweep of `job` (local or Slurm backend) and return its handle. `wait`: run it in this
    process to its end (Ctrl-C stops it and its trials); else a detached controller runs it.
    `base_dir`: what the job's relative paths are relative to (default: the working directory).
    ConfigError (nothing started, nothing written) for a sweep that cannot run as asked."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    data = base_job_data(job)
    # The base job's rules and the sweep's (launcher.config.tuning_rules: every trial's values, the
    # objective against the job's metrics); ConfigError lists them all.
    validated = validate_job({**data, "tuning": tuning.model_dump(mode="json", exclude_none=True)}, base_dir=base)
    backend = validated.config.backend_name
    issues = check_sweep(tuning, backend)
    if issues:
        raise ConfigError(issues)
    name = check_sweep_name(name, "name") if name else sweep_name(tuning.base_tuning_job_name, job)
    directory = sweep_state.sweep_dir(name)
    if directory.exists():
        raise ConfigError([Issue("name", name, f"is taken: a tuning job of that name exists ({directory})",
                                 "choose another name, or leave it out for a generated one")])
    seed = tuning.random_seed if tuning.random_seed is not None else random.SystemRandom().randrange(2**31)
    sweep_state.write(directory, {
        "HyperParameterTuningJobName": name, "Status": "InProgress", "Backend": backend,
        "Runner": validated.config.local_runner, "CreationTime": store.now(), "RandomSeed": seed,
        "Tuning": tuning.model_dump(mode="json", exclude_none=True), "Job": data, "BaseDir": str(base.resolve()),
        "Trials": []})
    handle = SweepHandle(name)
    if wait:
        Controller(directory, printer=printer, poll=poll).run()
    else:
        _start_detached(directory)
    return handle


def check_sweep(tuning: TuningConfig, backend: str) -> list[Issue]:
    """What stops this sweep from running on `backend` here (the ranges' and the objective's rules are
    launcher.config.tuning_rules', which validation runs)."""
    row = backend_table.named(backend)
    swept = " or ".join(b.name for b in backend_table.BACKENDS if b.sweeps)
    if row.sagemaker_jobs:
        return [Issue("backend", backend, "runs its sweeps as SageMaker tuning jobs, which `start_sweep` does not "
                      f"start (sweeps of backend {swept} only)", f"use the HyperparameterTuner, or backend {swept}")]
    if not row.sweeps:
        return [Issue("backend", backend, f"runs no sweeps: smlaunch runs a sweep's trials as jobs of backend {swept}",
                      f"use backend {swept} for the sweep")]
    return local_refusals(tuning)


def _start_detached(directory: Path) -> None:
    """`python -m launcher.tune.controller DIR` in a session of its own (as a local job's supervisor),
    waiting until it has recorded itself, so that `stop` can find it at once. A controller that ends,
    or does not start, before it records itself leaves the sweep Failed."""
    log = directory / sweep_state.LOG
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.tune.controller", str(directory)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + CONTROLLER_START_S
    while time.monotonic() < deadline:
        if sweep_state.load(directory / sweep_state.STATE).get("ControllerProcess"):
            return
        if proc.poll() is not None:
            reason = f"the sweep's controller ended at once (exit code {proc.returncode}); see {log}"
            _fail_unstarted(directory, reason)
            raise BackendError(reason)
        time.sleep(0.1)
    proc.kill()  # ours (its Popen): a controller that starts after its sweep is Failed must not run it
    proc.wait()
    reason = f"the sweep's controller (pid {proc.pid}) did not start within {CONTROLLER_START_S:.0f} s; see {log}"
    _fail_unstarted(directory, reason)
    raise BackendError(reason)


def _fail_unstarted(directory: Path, reason: str) -> None:
    current = sweep_state.load(directory / sweep_state.STATE)
    if current["Status"] == "InProgress":
        current.update(Status="Failed", EndTime=store.now(), FailureReason=reason)
        sweep_state.write(directory, current)


class SweepHandle:
    """A sweep run here or on Slurm, by name: what `smlaunch status/stop` and the SDK tuner call."""

    def __init__(self, name: str):
        self.name = check_sweep_name(name)
        self.orphans_stopped: list[str] = []  # trials state() stopped as their controller had ended

    @property
    def directory(self) -> Path:
        return sweep_state.sweep_dir(self.name)

    def state(self) -> dict:
        """The state file, reconciled: a sweep whose controller ended (or never started) without an
        outcome is Failed, and its trials, which nobody watches any more, are stopped."""
        current = sweep_state.read(self.name)
        gone = _controller_gone(current)
        if gone:
            # re-read: the controller may have written its end just before it exited
            current = sweep_state.read(self.name)
            if current["Status"] == "InProgress":
                log = self.directory / sweep_state.LOG
                reason = f"the sweep's controller ended without an outcome (killed?): {gone}; see {log}"
                self.orphans_stopped = _stop_orphans(current, reason)
                current.update(Status="Failed", EndTime=store.now(), FailureReason=reason)
                sweep_state.write(self.directory, current)
        return current

    def describe(self) -> dict:
        return describe_state(self.state())

    def best_trial(self) -> dict | None:
        """The best trial's summary (TrainingJobName, TunedHyperParameters, its final objective), or None."""
        return best_summary(self.state())

    def stop(self) -> str | None:
        """Stop the sweep: its controller stops the running trials and records it Stopped. A controller
        that had ended: state() has stopped the trials it left, and what was done is returned."""
        current = self.state()
        if self.orphans_stopped:
            return (f"tuning job {self.name}: its controller had ended, so the sweep is Failed; stopped its running "
                    f"trial(s) {', '.join(self.orphans_stopped)}")
        if current["Status"] in sweep_state.TERMINAL:
            raise BackendError(f"tuning job {self.name} has already ended ({current['Status']})")
        controller = current.get("ControllerProcess")
        if controller is None:
            raise BackendError(f"tuning job {self.name}: its controller is starting; stop it again in a few seconds")
        if not identity.send(controller, signal.SIGTERM):  # it ended since state() looked
            raise BackendError(f"tuning job {self.name}: its controller is gone; `smlaunch status {self.name}` "
                               "records the outcome")
        return None

    def wait(self, poll: float = 2.0) -> dict:
        """Until the sweep ends; its description."""
        while self.state()["Status"] not in sweep_state.TERMINAL:
            time.sleep(poll)
        return self.describe()


def _controller_gone(current: dict) -> str | None:
    """Why an InProgress sweep has no controller any more, or None: its recorded controller is not
    running, or none recorded itself within CONTROLLER_START_S of the sweep's creation."""
    if current["Status"] != "InProgress":
        return None
    controller = current.get("ControllerProcess")
    if controller is not None:
        return None if identity.is_running(controller) else identity.gone_because(controller)
    created = datetime.fromisoformat(current.get("CreationTime") or store.now())
    if (datetime.now(timezone.utc) - created).total_seconds() < CONTROLLER_START_S:
        return None  # its controller is starting
    return f"no controller recorded itself within {CONTROLLER_START_S:.0f} s of the sweep's creation"


def _stop_orphans(current: dict, reason: str) -> list[str]:
    """Stop the running trials of a sweep whose controller ended, recording each as its controller
    would; the names of those stopped."""
    running = [t for t in current["Trials"] if t["TrainingJobStatus"] == "InProgress"]
    backend = registry.backend_named(current["Backend"], runner=current.get("Runner") or "process") if any(
        "Handle" in t for t in running) else None
    stopped = []
    for trial in running:
        name, status = trial["TrainingJobName"], "Stopped"
        if "Handle" in trial:  # started: its job runs
            if stop_trial(backend, name, f"Stopped with its tuning job: {reason}") is None:
                stopped.append(name)
            else:  # it had ended: as it ended
                status = _job_status(backend, name)
        trial.update(TrainingJobStatus=status, TrainingEndTime=store.now())
        if status != "Completed":
            trial["FailureReason"] = reason
    return stopped


def _job_status(backend, name: str) -> str:
    try:
        return backend.describe(name)["TrainingJobStatus"]
    except BackendError:  # its directory is gone
        return "Failed"


def attach(name: str) -> SweepHandle:
    """The handle of an existing sweep; LookupError if there is none."""
    handle = SweepHandle(name)
    sweep_state.read(name)
    return handle
