"""What every backend shares: the interface and the errors a running job can end with.

The job-name rule is launcher.config.job_names (the job file validates it too)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from launcher.backends.errors import BackendError, FilesElsewhere, SettingError  # noqa: F401 - the interface's errors
from launcher.wire.masking import Masker, mask_secrets
from launcher.wire.opt_ml import failure_headline

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.backends.log_metrics import LogMetrics
    from launcher.backends.metric_records import JobMetrics
    from launcher.backends.sourcedir import SourceBundle
    from launcher.config.validate import ValidatedJob
    from launcher.wire.checkpoints import Checkpoint
    from launcher.wire.faults import Restart
    from launcher.wire.goodput import Goodput
    from launcher.wire.metric_lines import Progress

TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")


class DryRunResult(Protocol):
    def to_dict(self, masked: bool = True) -> dict: ...

    def render(self) -> str:
        """What `smlaunch submit --dry-run` prints."""


@dataclass(frozen=True)
class Options:
    """What a caller may say about how to reach or run a backend; each backend takes what it needs."""

    region: str | None = None  # SageMaker: the AWS region (default: the boto3 chain)
    session: Any = None  # SageMaker: a boto3.Session or a sagemaker.Session
    runner: str = "process"  # local: how the simulated hosts run (process or docker)
    printer: Callable[[str], None] | None = None  # where the backend's own messages go (default: print)
    console: Callable[[str, str, str], None] | None = None  # a local job run in this process: its hosts' lines
    # the caller's process runs nothing but the job (`smlaunch submit`): a job run in it may adopt its orphans
    adopt_orphans: bool = False


class Backend(Protocol):
    """What the estimator and the CLI call, whichever engine runs the job (torchx's scheduler
    interface, with SageMaker's words: a job is described by a DescribeTrainingJob-shaped dict).
    launcher.config.backend_table names each one's class; the registry makes it with `create`."""

    name: str  # its name in the backend table: the prefix of the job's handle

    @classmethod
    def create(cls, options: Options) -> Backend:
        """The backend as the caller's options make it."""

    def dryrun(self, job: ValidatedJob, job_name: str | None = None) -> DryRunResult:
        """What submit would send or start; nothing is sent, uploaded or written."""

    def submit(self, job: ValidatedJob, job_name: str | None = None, *, detach: bool = False) -> str:
        """Start the job and return its name. `detach=False` promises that `wait` follows (local
        mode then runs the job in this process); jobs of remote engines run detached anyway."""

    def describe(self, name: str) -> dict: ...

    def attach_fields(self, desc: dict) -> dict[str, Any]:
        """The job file's fields its description gives back beyond DescribeTrainingJob's (PyTorch.attach): the
        backend, its section, the code as the first host got it, ... ({} where DescribeTrainingJob says all)."""

    def how(self, record: dict) -> str:
        """How the job its record describes runs, in a few words (`submitted NAME (local, process runner)`)."""

    def wait(self, name: str, logs: bool = True, poll: float = 5.0) -> dict:
        """Follow to the end; JobFailedError unless it completed."""

    def interrupted(self, name: str) -> str | None:
        """What a Ctrl-C during `wait` did to a job that ran in the caller's process (local mode: its hosts
        stopped), for the caller to say; None where it only stopped following."""

    def logs(self, name: str, follow: bool = False, poll: float = 5.0) -> None: ...

    def stop(self, name: str) -> None:
        """Ask the job to stop: SIGTERM first, so the ranks can save a checkpoint."""

    def list(self, status: str | None = None, name_contains: str | None = None,
             max_results: int = 50) -> list[dict]: ...

    def exists(self, name: str) -> bool: ...

    def artifacts(self, name: str) -> dict[str, str]:
        """{"model.tar.gz": where, "output.tar.gz": where} for what the job has stored."""

    def progress(self, name: str) -> Progress | None:
        """The job's last progress record (launcher.wire.metric_lines); None before its first logged step,
        or for a script that writes none."""

    def checkpoint(self, name: str) -> Checkpoint | None:
        """The job's newest complete checkpoint (launcher.wire.checkpoints); None if it has none."""

    def metrics(self, name: str, logs: dict[str, LogMetrics] | None = None) -> JobMetrics:
        """The job's metric records, wherever it keeps them (launcher.backends.jobmetrics); NoMetricsError if it
        has none yet. `logs`: readers of jobs' logs by name that read on from where they stopped (a sweep's)."""

    def goodput(self, name: str) -> Goodput | None:
        """The job's measured goodput (launcher.wire.goodput); None where its records are not here
        (SageMaker: in output.tar.gz) or it wrote none (a script of the user's own)."""
        return None

    def restarts(self, name: str) -> list[Restart]:
        """The job's failed attempts, one record each, oldest first (launcher.wire.faults); the
        backends whose jobs restart by themselves read them, the others have none."""
        return []

    def job_dir(self, name: str) -> Path | None:
        """The job's directory in smlaunch's job store, where its supervisor keeps its log (logs/job.log), records
        and outputs on this machine (local and Slurm jobs); None for a job that runs from none."""

    def output_data_dirs(self, name: str) -> dict[str, Path]:
        """{host: its output data directory}, as readable on this machine (`smlaunch logs --diagnostics`
        reads diagnostics/ there); FilesElsewhere, saying where they are, where this machine cannot."""


@dataclass
class JobDryRun:
    """A dry run as data (`request`) and, where the engine has one, as the text it reads (`text`)."""

    backend: str
    request: dict[str, Any]
    text: str | None = None
    bundle: SourceBundle | None = None  # the code archive submit would build (its summary is printed)

    def to_dict(self, masked: bool = True) -> dict:
        return mask_secrets(self.request) if masked else self.request

    def render(self) -> str:
        if self.text is not None:  # the request's secrets, wherever the text quotes them
            return Masker.of(self.request)(self.text)
        return json.dumps(self.to_dict(), indent=2, default=str)


class JobFailedError(RuntimeError):
    """A job ended Failed or Stopped. Carries what the user needs to find out why.

    `shown`: the job's log, which holds the whole reason, was just printed (a followed local or
    Slurm job): the message then gives a reason of several lines by its first line only, so the
    failure report is printed once."""

    def __init__(self, job_name: str, status: str, reason: str = "", where: str = "", shown: bool = False):
        self.job_name, self.status, self.reason, self.where = job_name, status, reason, where
        text = f"job {job_name} {status.lower()}"
        if reason and shown and failure_headline(reason) != reason.strip():
            text += f": {failure_headline(reason)} (the whole report is in the job's output above)"
        elif reason:
            text += f": {reason}"
        if where:
            text += f"\n  logs: {where}"
        super().__init__(text)
