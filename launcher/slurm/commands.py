"""The Slurm client commands smlaunch uses (sbatch, squeue, scontrol, scancel), with bounded time
and errors that say what is missing; and the parsing of what they print."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from launcher.backends.base import BackendError

TIMEOUT_S = 60  # slurmctld answers in milliseconds; a minute means it is down or unreachable


def run(args: list[str], timeout: float = TIMEOUT_S) -> str:
    """stdout of a Slurm command; BackendError with its stderr if it fails or cannot be found."""
    if shutil.which(args[0]) is None:
        raise BackendError(f"{args[0]} is not on PATH: run smlaunch where the Slurm client commands are "
                           "(a login node), or install them (Debian: apt install slurm-client)")
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BackendError(f"{' '.join(args)} did not answer in {timeout:.0f} s: is slurmctld up?") from None
    if done.returncode != 0:
        raise BackendError(f"{' '.join(args)} failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip() or 'no message'}")
    return done.stdout


def sbatch(script: str, chdir: str) -> str:
    """Submit a batch script file; the Slurm job id."""
    out = run(["sbatch", "--parsable", f"--chdir={chdir}", script]).strip()
    job_id = out.split(";", 1)[0]  # --parsable: "<id>[;<cluster>]"
    if not job_id.isdigit():
        raise BackendError(f"sbatch answered {out!r}, not a job id")
    return job_id


@dataclass
class JobState:
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    reason: str  # why it waits or ended (Resources, Priority, NonZeroExitCode, ...)
    exit_code: str  # "<code>:<signal>"
    start: str = ""
    end: str = ""


def parse_record(line: str) -> dict[str, str]:
    """`scontrol show ... -o` prints one record as Key=Value pairs separated by spaces; a value may
    itself contain spaces only in the last keys (Command, WorkDir are single tokens here)."""
    fields: dict[str, str] = {}
    key = None
    for token in line.split():
        if "=" in token and token.split("=", 1)[0].isidentifier():
            key, value = token.split("=", 1)
            fields[key] = value
        elif key is not None:  # a value with spaces (Reason=..., Comment=...)
            fields[key] += " " + token
    return fields


def job_state(job_id: str) -> JobState | None:
    """What slurmctld knows of the job; None once it has forgotten it (after MinJobAge)."""
    try:
        out = run(["scontrol", "show", "job", "-o", job_id])
    except BackendError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    fields = parse_record(out.strip().splitlines()[0]) if out.strip() else {}
    if not fields:
        return None
    return JobState(fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""), fields.get("ExitCode", ""),
                    fields.get("StartTime", ""), fields.get("EndTime", ""))


def job_nodes(job_id: str) -> list[str]:
    """The nodes the job holds now, in Slurm's order: a node that failed under --no-kill has left
    the allocation (sbatch(1), --no-kill)."""
    out = run(["scontrol", "show", "job", "-o", job_id]).strip()
    nodelist = parse_record(out.splitlines()[0]).get("NodeList", "") if out else ""
    return hostnames(nodelist) if nodelist and nodelist != "(null)" else []


def node_address(node: str) -> str:
    """The address slurmd of `node` listens on (NodeAddr), which the other nodes reach it at."""
    fields = parse_record(run(["scontrol", "show", "node", "-o", node]).strip())
    return fields.get("NodeAddr") or node


def hostnames(nodelist: str) -> list[str]:
    """A compressed node list (n[1-2]) as node names, in Slurm's order."""
    return run(["scontrol", "show", "hostnames", nodelist]).split()
