"""A log file of a local job that a full disk cannot break.

The supervisor copies every host's output into `logs/<host>.log` and `logs/job.log`. When the disk
under them fills (ENOSPC, or any other write error), the copy must go on reading the hosts'
pipes, or the hosts block on a full pipe and the job never ends: so a write that fails is dropped
and counted, never raised, and the first error is kept for the job's failure reason. Writes are
unbuffered, so no failed write lingers in a buffer to fail again at close.
"""

from __future__ import annotations

from pathlib import Path


class LogFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.error: OSError | None = None  # the first write error
        self.dropped = 0  # bytes not written since
        try:
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            self._file, self.error = None, exc

    def write(self, data: bytes) -> bool:
        """Append `data`; False if it (or part of it) was dropped."""
        if self._file is None or self.error is not None:
            self.dropped += len(data)
            return False
        view = memoryview(data)
        while view:
            try:
                written = self._file.write(view)
            except OSError as exc:
                self.error, self.dropped = exc, self.dropped + len(view)
                return False
            view = view[written or 0:]
        return True

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:  # unbuffered: nothing is left to write, nothing is lost
                pass
