"""Frozen ranks: a rank that is stopped (SIGSTOP, `kill -STOP`, a debugger's stop) when a peer has
already ended.

A stopped process runs no signal handler and does not die of SIGTERM until it is continued, so
torchrun, stopping the ranks after one failed, would wait its whole shutdown timeout (100 s) for
it, and the job would stay InProgress that long. The bootstrap watches torchrun's children while
it runs: once one rank has ended, a rank still stopped after FROZEN_GRACE_S gets SIGCONT (the
SIGTERM torchrun sent it then acts) and, if it still lives FROZEN_GRACE_S later, SIGKILL. Which
ranks were frozen is kept for the failure report: they are the ones that never answered the
collective their peers failed in. A rank in uninterruptible sleep (a hung driver, state D) ends
only when the kernel lets it; nothing here can shorten that. Linux only (`/proc`).
"""

from __future__ import annotations

import os
import signal
import threading
import time

from launcher.wire.forked_ranks import process_environ
from launcher.wire.proc_stat import PROC, parent_and_state

POLL_S = 0.5
FROZEN_GRACE_S = 5.0


class FrozenRanks:
    def __init__(self, launcher_pid: int, log, on_first_end=None, alone_s: float | None = None,
                 agent_env: dict[str, str] | None = None):
        """`on_first_end()`: run (in a thread of its own) once, when the first rank has ended while
        others live: the moment to ask them for their stacks, before torchrun stops them.
        `alone_s`: a rank stopped this long is frozen even while no rank of this host has ended (its
        peers may be on other hosts, which a job with restarts restarts without this one: set only
        then, so a person's pause of a job that cannot restart is not ended)."""
        self.launcher_pid = launcher_pid
        self.agent_env = agent_env  # what the launcher was given (launcher.wire.forked_ranks.process_environ)
        self.log = log
        self.on_first_end = on_first_end
        self.alone_s = alone_s
        self.frozen: dict[int, str] = {}  # pid: "rank R (local rank L)" of each rank found frozen
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> FrozenRanks:
        if PROC.is_dir():
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        seen: set[int] = set()
        stopped_since: dict[int, float] = {}
        while not self._stopping.wait(POLL_S):
            ranks = children(self.launcher_pid)
            seen |= set(ranks)
            ended = bool(seen - set(ranks))
            if ended and self.on_first_end is not None and ranks:
                threading.Thread(target=self.on_first_end, daemon=True).start()
                self.on_first_end = None
            if not ended and self.alone_s is None:  # no rank has ended yet: a stop may be a user's pause
                continue
            now = time.monotonic()
            for pid, state in ranks.items():
                if state != "T":
                    stopped_since.pop(pid, None)
                    continue
                since = stopped_since.setdefault(pid, now)
                grace = FROZEN_GRACE_S if ended else self.alone_s
                if now - since >= grace and pid not in self.frozen:
                    self.frozen[pid] = _rank_of(pid, self.agent_env)
                    why = "while a peer has ended" if ended else f"for {grace:.0f} s (its peers on other hosts go on)"
                    self.log(f"{self.frozen[pid]} is stopped {why}: sending it SIGCONT, "
                             f"SIGKILL in {FROZEN_GRACE_S:.0f} s if it does not end")
                    _send(pid, self.launcher_pid, signal.SIGCONT)
                    threading.Timer(FROZEN_GRACE_S, _send, (pid, self.launcher_pid, signal.SIGKILL)).start()


def children(pid: int) -> dict[int, str]:
    """{pid: state} of the process's live children."""
    found: dict[int, str] = {}
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            stat = parent_and_state(child)
            if stat and stat[1] not in ("Z", "X"):
                found[child] = stat[1]
    return found


def _rank_of(pid: int, agent_env: dict[str, str] | None) -> str:
    environ = process_environ(pid, agent_env)  # torchrun's RANK, LOCAL_RANK ..., a forked rank's too
    return f"rank {environ.get('RANK', '?')} (local rank {environ.get('LOCAL_RANK', '?')}, pid {pid})"


def _send(pid: int, parent: int, signum: int) -> None:
    """Signal `pid` only while it is still the launcher's child (so still the rank it was)."""
    stat = parent_and_state(pid)
    if stat and stat[0] == parent:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
