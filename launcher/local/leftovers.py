"""The processes of a local job, found by a mark every one of them inherits.

The process runner puts `SMLAUNCH_LOCAL_JOB=<job directory>` into each bootstrap's environment;
torchrun, the ranks and whatever they start (data-loader workers, a user's helper processes)
inherit it. Process groups are not enough to find them: torchrun puts each rank in a session of
its own, and a rank whose torchrun was SIGKILLed is reparented to PID 1, out of every group the
supervisor can signal. `/proc/<pid>/environ` is the environment a process was started with, so
a script that edits `os.environ` keeps the mark. Linux only: elsewhere nothing is found.

A child can drop the mark (`env -i`, a daemonizer that clears its environment). Where the
supervisor is a process of its own (`smlaunch submit`, the detached supervisor), it is also a
child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): an orphaned descendant is reparented to it,
not to PID 1, so every descendant is found by ancestry too, mark or none. A process the user
runs the job in (the estimator's `fit`) is not made one: its other children are not the job's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

from launcher.wire.proc_stat import PROC, parent_and_state

MARK_ENV = "SMLAUNCH_LOCAL_JOB"


def mark(job_dir: Path) -> dict[str, str]:
    """The environment entry that makes a process (and its descendants) part of the job."""
    return {MARK_ENV: str(job_dir)}


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux 3.4+); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def descendants(ancestor: int, spare: frozenset[int] = frozenset()) -> list[int]:
    """Live descendants of `ancestor`, leaving out `spare` and theirs."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit():
            stat = parent_and_state(int(entry.name))
            if stat and stat[1] not in ("Z", "X"):
                children.setdefault(stat[0], []).append(int(entry.name))
    found, todo = [], [ancestor]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in spare:
                found.append(child)
                todo.append(child)
    return found


def reap_adopted(spare: frozenset[int]) -> None:
    """Collect the exit status of orphans this (subreaper) process adopted and that have ended, so
    none stays a zombie; `spare`: children whose status their Popen object collects."""
    me = os.getpid()
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit() and int(entry.name) not in spare and parent_and_state(int(entry.name)) == (me, "Z"):
            try:
                os.waitpid(int(entry.name), os.WNOHANG)
            except ChildProcessError:
                pass


def job_processes(job_dir: Path, ancestor: int | None = None, spare: frozenset[int] = frozenset()) -> list[int]:
    """Live processes carrying the job's mark (zombies have no environment and are left out), and
    with `ancestor` (a subreaper supervisor) its live descendants but `spare`."""
    needle = f"\0{MARK_ENV}={job_dir}\0".encode()
    found = descendants(ancestor, spare) if ancestor else []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # ended meanwhile, or another user's process
            continue
        if needle in b"\0" + environ + b"\0" and int(entry.name) not in found:
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        cmdline = "?"
    return f"pid {pid} ({cmdline.strip()[:80]})"


def end_job_processes(job_dir: Path, grace_s: float = 0.0, poll_s: float = 0.2, ancestor: int | None = None,
                      spare: frozenset[int] = frozenset()) -> list[str]:
    """SIGTERM every process of the job, SIGKILL what is left after `grace_s`; returns what was
    found (descriptions), so the caller can say what it ended. `ancestor`, `spare`: as job_processes."""
    def find() -> list[int]:
        return job_processes(job_dir, ancestor, spare)

    pids = find()
    ended = [describe(pid) for pid in pids]
    if grace_s > 0:
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(poll_s)
            pids = find()
    for _ in range(50):  # a process may fork while we kill: sweep until nothing is left
        if not pids:
            break
        _signal(pids, signal.SIGKILL)
        time.sleep(poll_s / 4)
        pids = find()
    if ancestor == os.getpid():
        reap_adopted(spare)
    return ended


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
