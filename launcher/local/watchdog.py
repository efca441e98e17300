"""The supervisor's watchdog: a local job's outcome when its supervisor dies without recording one
(SIGKILL, the OOM killer).

The supervisor (the foreground `smlaunch submit`, or the detached `launcher.local.supervise`)
starts `python -m launcher.local.abandoned JOB_DIR FD`, where FD is the read end of a pipe whose
write end only the supervisor holds. End of file on it means the supervisor is gone, however it
went. If the job's record still says InProgress then, the watchdog stops every process of the
job (SIGTERM, SIGKILL after SageMaker's grace period), packs the artifacts and records why, as
the supervisor would have. A supervisor that finishes records the outcome first, so its
watchdog finds a terminal status and leaves quietly. The watching program is launcher.local.abandoned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


class Watchdog:
    """The supervisor's side: the pipe's write end, closed when the outcome is recorded."""

    def __init__(self, job_dir: Path):
        read_fd, self._write_fd = os.pipe()  # both non-inheritable: the hosts never hold them
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "launcher.local.abandoned", str(job_dir), str(read_fd)],
                pass_fds=(read_fd,), stdin=subprocess.DEVNULL, start_new_session=True,  # no Ctrl-C
            )
        finally:
            os.close(read_fd)

    def release(self) -> None:
        """The outcome is recorded: let the watchdog go."""
        os.close(self._write_fd)
        self.proc.wait()
