"""The processes of a local job, found by a mark every one of them inherits.

The process runner puts `SMLAUNCH_LOCAL_JOB=<job directory>` into each bootstrap's environment;
torchrun, the ranks and whatever they start (data-loader workers, a user's helper processes)
inherit it. Process groups are not enough to find them: torchrun puts each rank in a session of
its own, and a rank whose torchrun was SIGKILLed is reparented to PID 1, out of every group the
supervisor can signal. `/proc/<pid>/environ` is the environment a process was started with, so
a script that edits `os.environ` keeps the mark. Linux only: elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

MARK_ENV = "SMLAUNCH_LOCAL_JOB"
PROC = Path("/proc")


def mark(job_dir: Path) -> dict[str, str]:
    """The environment entry that makes a process (and its descendants) part of the job."""
    return {MARK_ENV: str(job_dir)}


def job_processes(job_dir: Path) -> list[int]:
    """Live processes carrying the job's mark (zombies have no environment and are left out)."""
    needle = f"\0{MARK_ENV}={job_dir}\0".encode()
    found = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # ended meanwhile, or another user's process
            continue
        if needle in b"\0" + environ + b"\0":
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        cmdline = "?"
    return f"pid {pid} ({cmdline.strip()[:80]})"


def end_job_processes(job_dir: Path, grace_s: float = 0.0, poll_s: float = 0.2) -> list[str]:
    """SIGTERM every process of the job, SIGKILL what is left after `grace_s`; returns what was
    found (descriptions), so the caller can say what it ended."""
    pids = job_processes(job_dir)
    ended = [describe(pid) for pid in pids]
    if grace_s > 0:
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(poll_s)
            pids = job_processes(job_dir)
    for _ in range(50):  # a process may fork while we kill: sweep until nothing is left
        if not pids:
            break
        _signal(pids, signal.SIGKILL)
        time.sleep(poll_s / 4)
        pids = job_processes(job_dir)
    return ended


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
