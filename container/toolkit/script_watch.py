"""A script of the user's own that hangs, seen without its help (docs/own-scripts.md, "A script
that hangs"; the job field `hang_timeout`).

smlaunch's runtime has a step watchdog in every rank; a user's script has none. So the bootstrap
watches what any running script shows: the CPU time of its ranks (torchrun's children and what they
started; not torchrun, whose agent polls its workers all the time) and the bytes they have written
(their log files under torchrun's --log-dir, and the entry process's pipes). When neither has moved
for `hang_timeout` seconds, the script is hung: `on_hang()` runs once (the bootstrap collects every
rank's stacks and stops the attempt, which is then restarted as a hang is). A rank waiting in a
collective for a peer that never comes uses no CPU and writes nothing; one that spins on the CPU
while it waits (a busy-polling transport) is not seen, nor is a script whose other threads keep
working. Linux only (`/proc`).
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from container.toolkit.frozen_ranks import children
from launcher.wire.proc_stat import PROC, stat_fields

POLL_S = 1.0
_UTIME, _STIME = 11, 12  # utime and stime (fields 14, 15 of proc(5)), counted from the state field


class ScriptWatch:
    def __init__(self, launcher_pid: int, timeout_s: float, log_dir: Path, piped: Callable[[], int],
                 on_hang: Callable[[float], None]):
        """`piped()`: the bytes the entry process has written to its pipes so far; `on_hang(seconds)`:
        called once, with how long nothing moved."""
        self.launcher_pid, self.timeout_s, self.log_dir = launcher_pid, timeout_s, log_dir
        self.piped, self.on_hang = piped, on_hang
        self.hung_after: float | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> ScriptWatch:
        if PROC.is_dir():
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        last, since = None, time.monotonic()
        while not self._stopping.wait(POLL_S):
            mark = (cpu_ticks(self.launcher_pid), written(self.log_dir) + self.piped())
            now = time.monotonic()
            if mark != last:
                last, since = mark, now
            elif now - since >= self.timeout_s:
                self.hung_after = now - since
                self.on_hang(self.hung_after)
                return


def cpu_ticks(launcher_pid: int) -> int:
    """The CPU time (clock ticks) of the launcher's children and all their descendants."""
    total, todo = 0, list(children(launcher_pid))
    while todo:
        pid = todo.pop()
        fields = stat_fields(pid)
        if fields is not None:
            total += int(fields[_UTIME]) + int(fields[_STIME])
        todo += list(children(pid))
    return total


def written(log_dir: Path) -> int:
    """The bytes of every rank's log files under torchrun's --log-dir."""
    total = 0
    for path in glob.glob(str(Path(log_dir) / "*" / "attempt_*" / "*" / "*.log")):
        try:
            total += os.path.getsize(path)
        except OSError:
            continue
    return total
