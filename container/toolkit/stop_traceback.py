"""A stop is no crash: torchrun's traceback of the SIGTERM the bootstrap forwarded stays out of the log.

On a stop (StopTrainingJob, `smlaunch stop`, a spot interruption) the bootstrap forwards SIGTERM to
torchrun, whose elastic agent stops the ranks (they save a checkpoint and say so) and then leaves by
raising `SignalException: Process N got signal: 15` out of its `main`: 25 lines of traceback in the
job's log, after the ranks' own account, for what the bootstrap then reports in one line ("stopped
(exit code 143): received SIGTERM ..."). `StopTraceback` drops exactly that traceback from torchrun's
stderr, and only once the bootstrap has forwarded a stop: any other traceback, and a
SignalException nobody asked for (torchrun signalled by someone else), pass through.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_START = b"Traceback (most recent call last):"
_SIGNAL_EXCEPTION = re.compile(
    rb"^torch\.distributed\.elastic\.multiprocessing\.api\.SignalException: Process \d+ got signal: \d+\s*$")


class StopTraceback:
    """A filter of a byte stream (torchrun's stderr, in chunks): `feed` returns what to show.

    Until `stopping()` is true, chunks pass unchanged (a progress bar redrawn with \\r shows as it
    happens); after it, the stream is read by lines and a traceback is held until its exception
    line, then dropped if that is torch elastic's SignalException, else shown whole."""

    def __init__(self, stopping: Callable[[], bool]):
        self.stopping = stopping
        self.partial = b""  # the start of a line not yet ended
        self.held: list[bytes] = []  # a traceback's lines, until its exception line

    def feed(self, chunk: bytes, final: bool = False) -> bytes:
        if not (self.stopping() or self.partial or self.held):
            return chunk
        lines = (self.partial + chunk).splitlines(keepends=True)
        self.partial = lines.pop() if lines and not final and not lines[-1].endswith(b"\n") else b""
        shown: list[bytes] = []
        for line in lines:
            if self.held:
                self.held.append(line)
                if line[:1] not in (b" ", b"\t", b"\n"):  # the exception line ends a traceback
                    if not _SIGNAL_EXCEPTION.match(line):
                        shown += self.held
                    self.held = []
            elif line.startswith(_START):
                self.held = [line]
            else:
                shown.append(line)
        if final:
            shown += self.held
            self.held = []
        return b"".join(shown)
