"""A local job's outcome when its supervisor dies without recording one (SIGKILL, the OOM killer).

The supervisor (the foreground `smlaunch submit`, or the detached `launcher.local.supervise`)
starts `python -m launcher.local.watchdog JOB_DIR FD`, where FD is the read end of a pipe whose
write end only the supervisor holds. End of file on it means the supervisor is gone, however it
went. If the job's record still says InProgress then, the watchdog stops every process of the
job (SIGTERM, SIGKILL after SageMaker's grace period), packs the artifacts and records why, as
the supervisor would have. A supervisor that finishes records the outcome first, so its
watchdog finds a terminal status and leaves quietly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.backends.base import TERMINAL_STATUSES
from launcher.local import store


class Watchdog:
    """The supervisor's side: the pipe's write end, closed when the outcome is recorded."""

    def __init__(self, job_dir: Path):
        read_fd, self._write_fd = os.pipe()  # both non-inheritable: the hosts never hold them
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "launcher.local.watchdog", str(job_dir), str(read_fd)],
                pass_fds=(read_fd,), stdin=subprocess.DEVNULL, start_new_session=True,  # no Ctrl-C
            )
        finally:
            os.close(read_fd)

    def release(self) -> None:
        """The outcome is recorded: let the watchdog go."""
        os.close(self._write_fd)
        self.proc.wait()


def watch(job_dir: Path, read_fd: int) -> int:
    with os.fdopen(read_fd, "rb") as pipe:
        pipe.read()  # returns at end of file: the supervisor has closed it, or died
    record = store.read(job_dir.name, job_dir.parent)
    if record.get("TrainingJobStatus") in TERMINAL_STATUSES:
        return 0
    from launcher.local.spec import LocalJobSpec
    from launcher.local.supervise import Supervisor, runner_named

    spec = LocalJobSpec.load(job_dir)
    Supervisor(spec, runner_named(spec.runner, spec.runner_settings), printer=None).abandoned(record.get("SupervisorPid"))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m launcher.local.watchdog JOB_DIR FD", file=sys.stderr)
        return 2
    return watch(Path(argv[0]), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
