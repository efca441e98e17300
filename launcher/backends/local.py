"""Local jobs: simulated hosts on this machine (process or docker runner), with the backend interface.

`submit` prepares the job directory (launcher.local.prepare); `wait` runs the job in this
process when this backend prepared it (streaming the hosts' logs), or follows a job that runs
elsewhere (`submit(detach=True)` starts `python -m launcher.local.supervise` on its own).
Needs neither AWS nor boto3 unless the job reads or writes `s3://`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from launcher.backends.base import TERMINAL_STATUSES, BackendError, JobDryRun
from launcher.backends.jobdir import JobDirBackend
from launcher.config import ValidatedJob
from launcher.local import store
from launcher.local.spec import LocalJobSpec, RunnerError
from launcher.local.supervise import Printer, Supervisor, console_printer, runner_named


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalBackend(JobDirBackend):
    name = "local"

    def __init__(self, runner: str = "process", root: Path | None = None,
                 printer: Callable[[str], None] | None = None, console: Printer | None = console_printer):
        super().__init__(root, printer)
        self.runner_name = runner
        self.console = console
        self._prepared: dict[str, LocalJobSpec] = {}

    # --- submitting ----------------------------------------------------------------------
    def _runner_for(self, job: ValidatedJob):
        try:
            return runner_named(self.runner_name)
        except RunnerError as exc:
            raise BackendError(str(exc)) from None

    def _dry_run(self, job: ValidatedJob, spec: LocalJobSpec, runner) -> JobDryRun:
        return JobDryRun(self.name, {"LocalJob": {
            "TrainingJobName": spec.name, "JobDir": str(spec.job_dir), "Runner": spec.runner,
            "Hosts": spec.hosts, "ProcessesPerHost": spec.processes_per_host,
            "HyperParameters": spec.hyperparameters, "Environment": spec.environment,
            "Channels": {n: c.s3_data for n, c in job.config.channels().items()},
            "CheckpointDir": str(spec.checkpoint_dir), "OutputPath": spec.output_path or str(spec.job_dir / "output"),
            "MaxRuntimeInSeconds": spec.max_run}})

    def submit(self, job: ValidatedJob, job_name: str | None = None, *, detach: bool = False) -> str:
        """Prepare the job. `detach`: a supervisor process runs it on its own; without it, `wait`
        runs it in this process (and must be called)."""
        spec, _ = self._prepare(job, job_name)
        if detach:
            logs = spec.job_dir / "logs"
            with open(logs / "supervisor.log", "ab") as out:
                proc = subprocess.Popen([sys.executable, "-m", "launcher.local.supervise", str(spec.job_dir)],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
            store.update(spec.job_dir, SupervisorPid=proc.pid)
        else:
            store.update(spec.job_dir, SupervisorPid=os.getpid())
            self._prepared[spec.name] = spec
        return spec.name

    # --- following -----------------------------------------------------------------------
    def describe(self, name: str) -> dict:
        record = self._record(name)
        pid, watchdog = record.get("SupervisorPid"), record.get("WatchdogPid")
        # Once the supervisor and its watchdog (which records the outcome of a supervisor that died)
        # are both gone, nobody will: say so here.
        if (record["TrainingJobStatus"] == "InProgress" and name not in self._prepared and pid and not _alive(pid)
                and not (watchdog and _alive(watchdog))):
            record = store.update(self._dir(name), TrainingJobStatus="Failed", SecondaryStatus="Failed",
                                  StatusMessage="The supervisor ended without an outcome",
                                  FailureReason=f"the local supervisor (pid {pid}) ended without recording an "
                                                "outcome (killed?); see logs/job.log",
                                  TrainingEndTime=store.now())
        return record

    def wait(self, name: str, logs: bool = True, poll: float = 1.0) -> dict:
        """Run (or follow) the job to its end; raise JobFailedError if it fails or is stopped."""
        spec = self._prepared.pop(name, None)
        if spec is None:
            return super().wait(name, logs, poll)
        record = Supervisor(spec, runner_named(spec.runner), printer=self.console if logs else None).run()
        return self._completed(name, record)

    def stop(self, name: str) -> None:
        record = self.describe(name)
        if record["TrainingJobStatus"] in TERMINAL_STATUSES:
            raise BackendError(f"local job {name} has already ended ({record['TrainingJobStatus']})")
        pid = record.get("SupervisorPid")
        if not pid:
            raise BackendError(f"local job {name} has no supervisor to stop yet; try again in a moment")
        os.kill(pid, signal.SIGTERM)
