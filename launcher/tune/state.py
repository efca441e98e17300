"""A sweep's record on disk: `<home>/tuning/<sweep name>/sweep.json`, beside `<home>/jobs/`.

One JSON object, rewritten atomically and private (0600: it holds the base job, environment
included) each time the sweep learns something, so `smlaunch status SWEEP` may read it at any time:
the base job and its tuning section, the controller's identity (launcher.local.identity), and
one entry per trial (its job name, tuned values, status, objective values, failure reason).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.config.job_names import check_job_name
from launcher.local import identity, store
from launcher.wire.opt_ml import write_private
from launcher.wire.training.issues import ConfigError

STATE = "sweep.json"
LOG = "sweep.log"
TERMINAL = ("Completed", "Failed", "Stopped")
STATUSES = ("InProgress", *TERMINAL)
# The fields the commands read, and their types (as store's job records): a record without them is damaged.
_REQUIRED = {"HyperParameterTuningJobName": str, "Status": str, "Backend": str, "Tuning": dict, "Trials": list,
             "RandomSeed": int}
_TYPED = {"CreationTime": str, "EndTime": str, "LastModifiedTime": str, "FailureReason": str, "StatusMessage": str,
          "BestTrainingJobName": str, "Runner": str, "Job": dict, "BaseDir": str}
_TRIAL_REQUIRED = {"TrainingJobName": str, "TrainingJobStatus": str, "TunedHyperParameters": dict}
_TRIAL_TYPED = {"Handle": str, "Objective": list, "FailureReason": str, "EarlyStopped": str, "CreationTime": str,
                "TrainingStartTime": str, "TrainingEndTime": str, "ObjectiveUnreadable": str}


class DamagedSweep(store.DamagedRecord):
    """A sweep.json that is not a sweep's record (the CLI reports it as a damaged job record: exit 2)."""


def sweeps_root(root: Path | None = None) -> Path:
    """`<home>/tuning/`: beside the jobs root, as the jobs' environments are (store.envs_root)."""
    return (root or store.jobs_root()).parent / "tuning"


def sweep_dir(name: str, root: Path | None = None) -> Path:
    return sweeps_root(root) / check_job_name(name, "tuning job name")


def exists(name: str, root: Path | None = None) -> bool:
    return (sweep_dir(name, root) / STATE).is_file()


def write(directory: Path, state: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    state["LastModifiedTime"] = store.now()
    write_private(directory / STATE, json.dumps(state, indent=2, default=str) + "\n")


def read(name: str, root: Path | None = None) -> dict[str, Any]:
    """The sweep's record; LookupError if there is none, DamagedSweep if it is not one."""
    return load(sweep_dir(name, root) / STATE)


def load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise LookupError(f"no tuning job named {path.parent.name!r} (looked in {path.parent.parent})") from None
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise DamagedSweep(f"{path} is damaged: not JSON ({exc}); delete the sweep's directory") from None
    problem = _damage(state, path.parent.name)
    if problem:
        raise DamagedSweep(f"{path} is damaged: {problem}; delete the sweep's directory")
    return state


def _damage(state: Any, directory: str) -> str | None:
    """What makes `state` no sweep record that the commands can read and act on, or None."""
    if not isinstance(state, dict):
        return f"a JSON {type(state).__name__}, not an object"
    problem = store.fields_damage(state, _REQUIRED, _TYPED)
    if problem:
        return problem
    if state["HyperParameterTuningJobName"] != directory:
        return f"it names tuning job {json.dumps(state['HyperParameterTuningJobName'])[:60]}, not {directory}"
    if state.get("CreationTime") is not None and not _iso_time(state["CreationTime"]):
        return f"CreationTime is {json.dumps(state['CreationTime'])[:60]}, not a time"
    if state["Status"] not in STATUSES:
        return f"Status is {json.dumps(state['Status'])[:60]}, not one of {', '.join(STATUSES)}"
    objective = state["Tuning"].get("objective")
    if not (isinstance(objective, dict) and isinstance(objective.get("metric"), str)
            and objective.get("type") in ("Minimize", "Maximize")):
        return "Tuning has no objective (metric and Minimize or Maximize)"
    for index, trial in enumerate(state["Trials"]):
        problem = _trial_damage(trial)
        if problem:
            return f"Trials[{index}] {problem}"
    controller = state.get("ControllerProcess")
    if controller is not None and identity.problem(controller):
        return f"ControllerProcess {identity.problem(controller)}"
    return None


def _trial_damage(trial: Any) -> str | None:
    if not isinstance(trial, dict):
        return "is not an object"
    problem = store.fields_damage(trial, _TRIAL_REQUIRED, _TRIAL_TYPED)
    if problem:
        return problem
    try:
        check_job_name(trial["TrainingJobName"])
    except ConfigError:
        return f"TrainingJobName {json.dumps(trial['TrainingJobName'])[:60]} is not a job name"
    pairs = trial.get("Objective") or []
    if not all(isinstance(p, list) and len(p) == 2 and all(_number(x) for x in p) for p in pairs):
        return "Objective is not a list of [step, value] pairs"
    if trial.get("FinalObjective") is not None and not _number(trial["FinalObjective"]):
        return "FinalObjective is not a number"
    return None


def _iso_time(text: str) -> bool:
    try:
        return datetime.fromisoformat(text).tzinfo is not None
    except ValueError:
        return False


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def trial_values(job_name: str, root: Path | None = None) -> dict[str, Any] | None:
    """The tuned hyperparameters of a job that is a trial of a sweep here (`<sweep>-NNN`), else None."""
    sweep, _, number = job_name.rpartition("-")
    if not number.isdigit():
        return None
    try:
        current = read(sweep, root)
    except (LookupError, ConfigError):  # no such sweep (or a damaged one: `status` names it), or no sweep name
        return None
    return next((t["TunedHyperParameters"] for t in current["Trials"] if t["TrainingJobName"] == job_name), None)


def list_sweeps(root: Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(records newest first, what is damaged in each damaged one: its path and why)."""
    base = sweeps_root(root)
    found, damaged = [], []
    for path in sorted(base.glob(f"*/{STATE}")) if base.is_dir() else ():
        try:
            found.append(load(path))
        except DamagedSweep as exc:
            damaged.append(str(exc))
        except LookupError:  # deleted while listing
            continue
    found.sort(key=lambda s: s.get("CreationTime", ""), reverse=True)
    return found, damaged
