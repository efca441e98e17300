"""A rank forked from a preloaded agent (container/distributed/forked_ranks.py), as the bootstrap
finds it (container/toolkit/frozen_ranks.py, diagnostics.py).

A rank torchrun starts as a program shows its rank in `/proc/<pid>/environ`, which the bootstrap
reads to prove a child is a rank before it signals it and to name it. A forked rank's `environ` is
its agent's as the agent started (torch elastic sets the rank's variables inside the process,
where /proc does not see them), so each forked rank writes, as it starts, the variables torch
elastic gave it into the directory its agent's environment names: the rank's environment as it
started is then its agent's plus those. An agent forked from the host's template
(container/distributed/zygote.py) shows the template's environment, the first attempt's, so the
rank also writes the variables the bootstrap gives each attempt (its number, its fault, heartbeat and
Flight Recorder files), and the directory is the host's, the same for every attempt. Only those
variables are written: never a secret of the job's environment.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

from launcher.wire.diagnostics import FLIGHT_RECORDER_FILES
from launcher.wire.faults import ATTEMPT_ENV, FAULT_DIR_ENV
from launcher.wire.heartbeat import HEARTBEAT_DIR_ENV
from launcher.wire.pod_config import WORKER_VARIABLES
from launcher.wire.proc_stat import PROC, parent_and_state

RANKS_DIR_ENV = "SMLAUNCH_FORKED_RANKS_DIR"
# The address of a local job's agent template, shared by its simulated hosts (the process runner starts it;
# container.distributed.zygote): an abstract Unix socket's name
TEMPLATE_ENV = "SMLAUNCH_AGENT_TEMPLATE"
TEMPLATE_HEADER = struct.Struct("!I")  # the length of a request to the agent template (container.distributed.zygote)
# What torch elastic's agent sets for each worker: its worker variables (pod_config's list), its error
# file and the thread count torchrun sets for several ranks; and what the bootstrap sets for each attempt
# (container.toolkit.bootstrap.child_environment).
RANK_VARIABLES = (*WORKER_VARIABLES, "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
                  ATTEMPT_ENV, FAULT_DIR_ENV, HEARTBEAT_DIR_ENV, *FLIGHT_RECORDER_FILES)


def write_rank(directory: Path, pid: int, environ) -> None:
    """The forked rank `pid`'s variables from torch elastic, NUL-separated as /proc writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{name}={environ[name]}\0" for name in RANK_VARIABLES if name in environ)
    (directory / str(pid)).write_text(text)


def process_environ(pid: int, agent_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process's environment as it started; a forked rank's with its rank's variables; {} if
    unreadable (the process is gone). `agent_env`: the environment its agent was given, where the
    bootstrap knows it: /proc shows an agent forked from a template the template's, not its own
    (container.distributed.zygote), so the bootstrap passes its own record of it; without it, the
    agent's /proc environment."""
    environ = _read(PROC / str(pid) / "environ")
    if not environ or "RANK" in environ:
        return environ
    if agent_env is None:
        stat = parent_and_state(pid)
        agent_env = _read(PROC / str(stat[0]) / "environ") if stat else {}
    if RANKS_DIR_ENV not in agent_env:
        return environ
    rank = _read(Path(agent_env[RANKS_DIR_ENV]) / str(pid))
    return {**agent_env, **rank} if rank else environ


def _read(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)
