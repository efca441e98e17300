"""A sweep's record on disk: `<home>/tuning/<sweep name>/sweep.json`, beside `<home>/jobs/`.

One JSON object, rewritten atomically and private (0600: it holds the base job, environment
included) each time the sweep learns something, so `smlaunch status SWEEP` may read it at any time:
the base job and its tuning section, the controller's identity (launcher.local.identity), and
one entry per trial (its job name, tuned values, status, objective values, failure reason).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.config.job_names import check_job_name
from launcher.local import store
from launcher.wire.opt_ml import write_private

STATE = "sweep.json"
LOG = "sweep.log"
TERMINAL = ("Completed", "Failed", "Stopped")


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
    if not isinstance(state, dict) or not isinstance(state.get("Trials"), list) or "Status" not in state:
        raise DamagedSweep(f"{path} is damaged: not a sweep record (no Status or Trials); delete the sweep's "
                           "directory")
    return state


def list_sweeps(root: Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(records newest first, paths of damaged ones)."""
    base = sweeps_root(root)
    found, damaged = [], []
    for path in sorted(base.glob(f"*/{STATE}")) if base.is_dir() else ():
        try:
            found.append(load(path))
        except DamagedSweep:
            damaged.append(str(path))
        except LookupError:  # deleted while listing
            continue
    found.sort(key=lambda s: s.get("CreationTime", ""), reverse=True)
    return found, damaged
