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
from typing import Any

from launcher.backends.base import TERMINAL_STATUSES, BackendError, JobDryRun, Options
from launcher.backends.jobdir import JobDirBackend
from launcher.config import ValidatedJob
from launcher.local import identity, store
from launcher.local.spec import LocalJobSpec, RunnerError
from launcher.local.supervise import Printer, Supervisor, console_printer, runner_named


class LocalBackend(JobDirBackend):
    name = "local"

    def __init__(self, runner: str = "process", root: Path | None = None,
                 printer: Callable[[str], None] | None = None, console: Printer | None = console_printer):
        super().__init__(root, printer)
        self.runner_name = runner
        self.console = console
        self._prepared: dict[str, LocalJobSpec] = {}
        self._ran: set[str] = set()  # the jobs `wait` ran in this process
        # Set by a caller whose process runs nothing but the job (`smlaunch submit`): its supervisor
        # may then adopt every orphaned descendant (launcher.local.leftovers). Never in a user's Python.
        self.adopt_orphans = False

    @classmethod
    def create(cls, options: Options) -> LocalBackend:
        console = {"console": options.console} if options.console else {}  # else the default: print them
        backend = cls(runner=options.runner, printer=options.printer, **console)
        backend.adopt_orphans = options.adopt_orphans
        return backend

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
            store.update(spec.job_dir, SupervisorPid=proc.pid, SupervisorProcess=identity.of(proc.pid))
        else:
            store.update(spec.job_dir, SupervisorPid=os.getpid(), SupervisorProcess=identity.of(os.getpid()))
            self._prepared[spec.name] = spec
        return spec.name

    # --- following -----------------------------------------------------------------------
    def attach_fields(self, desc: dict) -> dict[str, Any]:
        return {**super().attach_fields(desc), "local_runner": desc.get("LocalRunner", "process")}

    def how(self, record: dict) -> str:
        return f"local, {self.runner_name} runner"

    def describe(self, name: str) -> dict:
        record = self._record(name)
        supervisor, watchdog = identity.recorded(record, "Supervisor"), identity.recorded(record, "Watchdog")
        # Once the supervisor and its watchdog (which records the outcome of a supervisor that died)
        # are both gone, nobody will: say so here. A pid that now names another process is gone too.
        if (record["TrainingJobStatus"] == "InProgress" and name not in self._prepared and supervisor
                and not identity.is_running(supervisor) and not (watchdog and identity.is_running(watchdog))):
            record = self._reconcile(name, TrainingJobStatus="Failed", SecondaryStatus="Failed",
                                     StatusMessage="The supervisor ended without an outcome",
                                     FailureReason=f"ClientError: the local supervisor (pid {supervisor['Pid']}) "
                                                   "ended without recording an outcome (killed?): "
                                                   f"{identity.gone_because(supervisor)}; see logs/job.log",
                                     TrainingEndTime=store.now())
        return record

    def _reconcile(self, name: str, **fields) -> dict:
        """The record with what a read found out; written back when it can be. A read command
        (status, list) still answers when it cannot (a full disk, a read-only home): the
        record it shows says so, and the next read tries again."""
        directory = self._dir(name)
        try:
            return store.update(directory, outcome=True, **fields)
        except FileNotFoundError:  # the job was deleted meanwhile: never re-created here
            raise BackendError(f"local job {name} was deleted ({directory})") from None
        except OSError as exc:
            record = store.merged(directory, **fields)
            record["RecordNotUpdated"] = f"{directory / store.RECORD} could not be rewritten: {exc}"
            return record

    def wait(self, name: str, logs: bool = True, poll: float = 1.0) -> dict:
        """Run (or follow) the job to its end; raise JobFailedError if it fails or is stopped."""
        spec = self._prepared.pop(name, None)
        if spec is None:
            return super().wait(name, logs, poll)
        self._ran.add(name)
        record = Supervisor(spec, runner_named(spec.runner), printer=self.console if logs else None,
                            adopt_orphans=self.adopt_orphans).run()
        return self._completed(name, record, shown=logs)

    def interrupted(self, name: str) -> str | None:
        """A job run here stops with its supervisor, every host with it (Ctrl-C reaches the whole session)."""
        if name not in self._ran:
            return None
        return f"{name} stopped; every host has ended. Logs: {self._dir(name)}/logs/job.log"

    def stop(self, name: str) -> None:
        record = self.describe(name)
        if record["TrainingJobStatus"] in TERMINAL_STATUSES:
            raise BackendError(f"local job {name} has already ended ({record['TrainingJobStatus']})")
        supervisor = identity.recorded(record, "Supervisor")
        if not supervisor:
            raise BackendError(f"local job {name} has no supervisor to stop yet; try again in a moment")
        if not identity.send(supervisor, signal.SIGTERM):  # ended between describe and now
            raise BackendError(f"local job {name}: its supervisor (pid {supervisor['Pid']}) is gone; "
                               f"`smlaunch status {name}` records the outcome")
