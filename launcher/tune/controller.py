"""The process that runs a sweep: it starts trials `max_parallel_jobs` at a time through the job's
backend (local or Slurm), reads their objectives, stops the ones the median rule condemns, and
records everything in the sweep's state file (launcher.tune.state).

It is either the foreground `smlaunch tune` (or `start_sweep(wait=True)`) process, or, detached,
`python -m launcher.tune.controller SWEEP_DIR`. Either way the state file names it
(launcher.local.identity), so `smlaunch stop SWEEP` signals this process and no other: SIGTERM
stops the running trials (each through its backend's stop, so they checkpoint), waits for them to
end and records the sweep Stopped.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from launcher.backends import registry
from launcher.backends.base import TERMINAL_STATUSES, BackendError
from launcher.backends.log_metrics import LogMetrics
from launcher.config.tuning import TuningConfig
from launcher.local import identity, store
from launcher.tune import state as sweep_state
from launcher.tune.median import median_stop
from launcher.tune.objective import ObjectiveUnreadable, better, final, objective_series
from launcher.tune.strategies import strategy_for
from launcher.tune.trials import stop_trial, trial_job, trial_name
from launcher.wire.terminal import as_data
from launcher.wire.training.issues import ConfigError

POLL_S = 2.0


class Controller:
    def __init__(self, directory: Path, printer: Callable[[str], None] | None = None, poll: float = POLL_S):
        self.dir, self.poll = directory, poll
        self.state = sweep_state.load(directory / sweep_state.STATE)
        self._log_file = open(directory / sweep_state.LOG, "a", encoding="utf-8")  # noqa: SIM115 - closed in run
        self.echo = printer
        self.backend = None  # the rest is made in run, once the controller has recorded itself
        self.stop_reason: str | None = None  # set by SIGTERM (or the sweep's own limits)
        self.logs: dict[str, LogMetrics] = {}  # the trials' logs as read so far, by trial (a script's metrics)
        objective = self.state["Tuning"]["objective"]  # as sweep_state.load checked it
        self.minimize, self.metric = objective["type"] == "Minimize", objective["metric"]

    def _prepare(self) -> None:
        self.tuning = TuningConfig.model_validate(self.state["Tuning"])
        self.backend = registry.backend_named(self.state["Backend"], runner=self.state.get("Runner") or "process",
                                              printer=self.log)
        self.strategy = strategy_for(self.tuning, self.state["RandomSeed"])

    # --- the record --------------------------------------------------------------------------
    def log(self, line: str) -> None:
        line = as_data(line)  # it names the user's metric, hyperparameters and values: shown, never obeyed
        self._log_file.write(line + "\n")
        self._log_file.flush()
        if self.echo:
            self.echo(line)

    def save(self) -> None:
        sweep_state.write(self.dir, self.state)

    def trials(self, *statuses: str) -> list[dict]:
        return [t for t in self.state["Trials"] if not statuses or t["TrainingJobStatus"] in statuses]

    # --- the run -----------------------------------------------------------------------------
    def run(self) -> dict:
        """Run the sweep to its end; the final state. Ctrl-C stops it as `smlaunch stop` does. The
        controller records itself first, so that whatever fails after (a bug, a lost disk) leaves the
        sweep Failed with the reason, its running trials stopped, rather than InProgress for ever."""
        self.state["ControllerProcess"] = identity.of(os.getpid())
        self.save()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        started = time.monotonic()
        try:
            try:
                self._prepare()
                self._loop(started)
            except KeyboardInterrupt:
                self.stop_reason = self.stop_reason or "Stopped by the user (interrupted)"
                self._wind_down()
                raise
            except Exception as exc:  # a bug or a lost disk: its traceback goes to the log, its end to the state
                self._log_file.write(traceback.format_exc())
                self._failed(f"the sweep's controller failed: {type(exc).__name__}: {exc}")
            return self.state
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._log_file.close()

    def _on_sigterm(self, signum, frame) -> None:
        self.stop_reason = self.stop_reason or "Stopped by the user"

    def _loop(self, started: float) -> None:
        self.log(f"sweep {self.state['HyperParameterTuningJobName']}: {self.tuning.strategy} over "
                 f"{', '.join(self.tuning.ranges)}, {self.tuning.trial_count()} trial(s), "
                 f"{self.tuning.max_parallel_jobs} at a time, objective {self.tuning.objective.type} {self.metric}")
        exhausted = False
        while True:
            self._refresh()
            if self.tuning.early_stopping == "Auto":
                self._early_stop()
            self.stop_reason = self.stop_reason or self._limit_reached(started)
            if self.stop_reason:
                self._wind_down()
                return
            while not exhausted and len(self.trials("InProgress")) < self.tuning.max_parallel_jobs:
                exhausted = not self._launch()
            if exhausted and not self.trials("InProgress"):
                self._finish()
                return
            self.save()
            time.sleep(self.poll)

    def _launch(self) -> bool:
        """Start the next trial; False when the strategy has none left."""
        index = len(self.state["Trials"])
        values = self.strategy.ask(index) if index < self.tuning.trial_count() else None
        if values is None:
            return False
        name = trial_name(self.state["HyperParameterTuningJobName"], index)
        trial = {"TrainingJobName": name, "TunedHyperParameters": values, "TrainingJobStatus": "InProgress",
                 "CreationTime": store.now(), "Objective": []}
        self.state["Trials"].append(trial)
        shown = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
        try:
            job = trial_job(self.state["Job"], self.state["BaseDir"], values)
            self.backend.submit(job, name, detach=True)
            trial["Handle"] = f"{self.backend.name}:{name}"
            self.log(f"trial {name} started: {shown}")
        except (ConfigError, BackendError) as exc:
            reason = str(exc) if isinstance(exc, BackendError) else "; ".join(str(i) for i in exc.issues)
            self._ended(trial, "Failed", reason=f"the trial could not be started: {reason}")
        self.save()
        return True

    def _refresh(self, heed_stop: bool = True) -> None:
        """Each started trial's status and objective so far. `heed_stop`: a stop asked for meanwhile
        (SIGTERM) ends the round, so that a sweep of many trials stops at once."""
        for trial in self.trials("InProgress"):
            if heed_stop and self.stop_reason:
                return
            if "Handle" not in trial:
                continue
            try:
                record = self.backend.describe(trial["TrainingJobName"])
            except BackendError as exc:  # its directory was deleted: nothing will end it
                self._ended(trial, "Failed", reason=str(exc))
                continue
            self._read_objective(trial)
            trial["TrainingStartTime"] = record.get("TrainingStartTime")
            status = record["TrainingJobStatus"]
            if status in TERMINAL_STATUSES and record.get("SecondaryStatus") != "Stopping":
                self._ended(trial, status, reason=record.get("FailureReason"), end=record.get("TrainingEndTime"))

    def _read_objective(self, trial: dict) -> None:
        """The trial's objective so far, its log read on from the last look; a trial whose objective
        can no longer be read is stopped (its values would be the sweep's choice, and wrong)."""
        try:
            trial["Objective"] = objective_series(self.backend, trial["TrainingJobName"], self.metric, self.logs)
        except ObjectiveUnreadable as exc:
            if not trial.get("ObjectiveUnreadable"):
                trial["ObjectiveUnreadable"] = str(exc)
                self._stop_trial(trial, f"Stopped by its tuning job: {exc}")

    def _ended(self, trial: dict, status: str, reason: str | None = None, end: str | None = None) -> None:
        trial.update(TrainingJobStatus=status, TrainingEndTime=end or store.now())
        self.logs.pop(trial["TrainingJobName"], None)
        value = final(trial.get("Objective") or [])
        if trial.get("ObjectiveUnreadable"):
            status, reason = "Failed", trial["ObjectiveUnreadable"]
            trial["TrainingJobStatus"] = status
        if reason and status != "Completed":
            trial["FailureReason"] = reason
        counted = (status == "Completed" or trial.get("EarlyStopped")) and not trial.get("ObjectiveUnreadable")
        trial["FinalObjective"] = value if counted else None
        index = self.state["Trials"].index(trial)
        self.strategy.tell(index, trial["FinalObjective"])
        objective = f", {self.metric} {value:.6g}" if value is not None and counted else ""
        why = f": {reason}" if reason and status == "Failed" else ""
        self.log(f"trial {trial['TrainingJobName']} {status.lower()}{objective}{why}")
        self._choose_best()

    def _choose_best(self) -> None:
        best = None
        for trial in self.state["Trials"]:
            value = trial.get("FinalObjective")
            if value is not None and (best is None or better(value, best["FinalObjective"], self.minimize)):
                best = trial
        self.state["BestTrainingJobName"] = best["TrainingJobName"] if best else None

    def _early_stop(self) -> None:
        earlier = [t["Objective"] for t in self.state["Trials"]
                   if t.get("FinalObjective") is not None and t.get("Objective")]
        for trial in self.trials("InProgress"):
            if trial.get("EarlyStopped") or "Handle" not in trial:
                continue
            why = median_stop(trial.get("Objective") or [], earlier, self.minimize)
            if why:
                trial["EarlyStopped"] = why
                self._stop_trial(trial, f"Stopped by early stopping (the median rule): {why}")

    def _stop_trial(self, trial: dict, reason: str) -> None:
        name = trial["TrainingJobName"]
        problem = stop_trial(self.backend, name, reason)
        # not stopped: it ended meanwhile, and _refresh records how
        self.log(f"trial {name}: not stopped: {problem}" if problem else f"trial {name}: stopping: {reason}")

    def _limit_reached(self, started: float) -> str | None:
        limit = self.tuning.max_runtime_in_seconds
        if limit and time.monotonic() - started > limit:
            return f"Stopped: the sweep ran longer than max_runtime_in_seconds ({limit} s)"
        criteria = self.tuning.completion_criteria
        best = self._best_value()
        if criteria and criteria.target_objective_value is not None and best is not None and not better(
                criteria.target_objective_value, best, self.minimize):
            return f"Completed: a trial reached target_objective_value {criteria.target_objective_value:g}"
        if criteria and criteria.max_jobs_not_improving and self._not_improving() >= criteria.max_jobs_not_improving:
            return f"Completed: {criteria.max_jobs_not_improving} trials in a row did not improve on the best"
        return None

    def _best_value(self) -> float | None:
        best = self.state.get("BestTrainingJobName")
        return next((t["FinalObjective"] for t in self.state["Trials"] if t["TrainingJobName"] == best), None)

    def _not_improving(self) -> int:
        """Trials that ended, in the order they ended, since the last one that improved on the best."""
        ended = sorted((t for t in self.state["Trials"] if t["TrainingJobStatus"] in TERMINAL_STATUSES),
                       key=lambda t: t["TrainingEndTime"])
        best, since = None, 0
        for trial in ended:
            value = trial.get("FinalObjective")
            if value is not None and (best is None or better(value, best, self.minimize)):
                best, since = value, 0
            else:
                since += 1
        return since

    # --- the end -----------------------------------------------------------------------------
    def _wind_down(self) -> None:
        """Stop the running trials, wait for each to end, and record the sweep's end."""
        reason = self.stop_reason or "Stopped by the user"
        self.log(f"sweep: {reason}; stopping {len(self.trials('InProgress'))} running trial(s)")
        for trial in self.trials("InProgress"):
            if "Handle" in trial:
                self._stop_trial(trial, f"Stopped with its tuning job: {reason}")
            else:
                self._ended(trial, "Stopped")
        while self.trials("InProgress"):
            self.save()
            time.sleep(self.poll)
            self._refresh(heed_stop=False)
        self._finish(status="Completed" if reason.startswith("Completed") else "Stopped", message=reason)

    def _failed(self, reason: str) -> None:
        for trial in self.trials("InProgress"):
            if "Handle" in trial:
                self._stop_trial(trial, f"Stopped with its tuning job: {reason}")
        self.state.update(Status="Failed", FailureReason=reason, EndTime=store.now())
        self.save()
        self.log(f"sweep failed: {reason}")

    def _finish(self, status: str = "Completed", message: str | None = None) -> None:
        trials = self.state["Trials"]
        scored = [t for t in trials if t.get("FinalObjective") is not None]
        if status == "Completed" and not scored:
            status = "Failed"
            failed = next((t for t in trials if t.get("FailureReason")), None)
            self.state["FailureReason"] = (
                f"every trial failed; the first, {failed['TrainingJobName']}: {failed['FailureReason']}" if failed
                else f"no trial reported the objective metric {self.metric}")
        self.state.update(Status=status, EndTime=store.now())
        if message:
            self.state["StatusMessage"] = message
        self.save()
        best = self.state.get("BestTrainingJobName")
        self.log(f"sweep {status.lower()}" + (f"; best trial {best}: {self.metric} {self._best_value():.6g}"
                                              if best else ""))


def main(argv: list[str] | None = None) -> int:
    """`python -m launcher.tune.controller SWEEP_DIR`: the detached controller (its output: sweep.log)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m launcher.tune.controller SWEEP_DIR", file=sys.stderr)
        return 2
    final = Controller(Path(args[0])).run()
    return 1 if final["Status"] == "Failed" else 0


if __name__ == "__main__":
    sys.exit(main())
