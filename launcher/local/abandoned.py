"""The watchdog's program: wait for the supervisor's pipe to close, then finish a job it abandoned.

`python -m launcher.local.abandoned JOB_DIR FD` is started by launcher.local.watchdog.Watchdog. End
of file on FD means the supervisor is gone; if the job's record still says InProgress, the job is
ended as the supervisor would have ended it (launcher.local.supervise.Supervisor.abandoned).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from launcher.backends.base import TERMINAL_STATUSES
from launcher.local import store
from launcher.local.spec import LocalJobSpec
from launcher.local.supervise import Supervisor, runner_named


def watch(job_dir: Path, read_fd: int) -> int:
    with os.fdopen(read_fd, "rb") as pipe:
        pipe.read()  # returns at end of file: the supervisor has closed it, or died
    record = store.read(job_dir.name, job_dir.parent)
    # The outcome is recorded (with its end time): a job recorded Failed as its first host failed
    # is still being stopped, and the watchdog must finish that.
    if record.get("TrainingJobStatus") in TERMINAL_STATUSES and record.get("TrainingEndTime"):
        return 0
    spec = LocalJobSpec.load(job_dir)
    Supervisor(spec, runner_named(spec.runner, spec.runner_settings), printer=None).abandoned(
        record.get("SupervisorPid"))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m launcher.local.abandoned JOB_DIR FD", file=sys.stderr)
        return 2
    return watch(Path(argv[0]), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
