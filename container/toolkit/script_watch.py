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
working. A script that calls launcher.wire.heartbeat.beat() is watched by its beats instead, from
its first one: hung when no rank has beaten for `hang_timeout`, whatever its CPU and output.
Linux only (`/proc`).
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from container.toolkit.frozen_ranks import children
from launcher.wire.heartbeat import newest_beat
from launcher.wire.proc_stat import PROC, stat_fields

POLL_S = 1.0


class Silence(NamedTuple):
    """What did not move, as the bootstrap says it: in its line, in the failure, as the stacks' reason."""

    line: str
    failure: str
    reason: str


SILENT = Silence("have used no CPU and written nothing", "used no CPU and wrote nothing", "no CPU and no output")
UNBEATING = Silence("have sent no heartbeat", "sent no heartbeat", "no heartbeat")
_UTIME, _STIME = 11, 12  # utime and stime (fields 14, 15 of proc(5)), counted from the state field


class ScriptWatch:
    def __init__(self, launcher_pid: int, timeout_s: float, log_dir: Path, piped: Callable[[], int],
                 on_hang: Callable[[float], None], beats: Path | None = None):
        """`piped()`: the bytes the entry process has written to its pipes so far; `on_hang(seconds)`:
        called once, with how long nothing moved; `beats`: the ranks' heartbeat directory."""
        self.launcher_pid, self.timeout_s, self.log_dir = launcher_pid, timeout_s, log_dir
        self.piped, self.on_hang, self.beats = piped, on_hang, beats
        self.hung_after: float | None = None
        self.by_beats = False  # the script has beaten: its beats alone say it moves
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
            mark = self.mark()
            now = time.monotonic()
            if mark != last:
                last, since = mark, now
            elif now - since >= self.timeout_s:
                self.hung_after = now - since
                self.on_hang(self.hung_after)
                return

    def mark(self) -> tuple:
        """What moves while the script works: its newest heartbeat once it has beaten, else its ranks' CPU
        time and the bytes they and the entry process wrote."""
        beat = newest_beat(self.beats) if self.beats else None
        if beat is not None:
            self.by_beats = True
            return ("beat", beat)
        return (cpu_ticks(self.launcher_pid), written(self.log_dir) + self.piped())

    @property
    def silence(self) -> Silence:
        return UNBEATING if self.by_beats else SILENT


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
