"""Local jobs with the SageMaker backend's interface: submit, wait, describe, logs, stop, list.

`submit` prepares the job directory (launcher.local.prepare); `wait` runs the job in this
process when this backend prepared it (streaming the hosts' logs), or follows a job that runs
elsewhere (`submit(detach=True)` starts `python -m launcher.local.supervise` on its own).
Needs neither AWS nor boto3 unless the job reads or writes `s3://`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launcher.backends.base import TERMINAL_STATUSES, BackendError, JobFailedError
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


class LocalBackend:
    def __init__(self, runner: str = "process", root: Path | None = None,
                 printer: Callable[[str], None] | None = None, console: Printer | None = console_printer):
        self.runner_name, self.root = runner, root
        self.print = printer or print
        self.console = console
        self._prepared: dict[str, LocalJobSpec] = {}

    def _dir(self, name: str) -> Path:
        return store.job_dir(name, self.root)

    # --- submitting ----------------------------------------------------------------------
    def submit(self, job: ValidatedJob, job_name: str | None = None, detach: bool = False) -> str:
        from launcher.local.prepare import prepare

        try:
            runner = runner_named(self.runner_name)
            spec = prepare(job, runner, job_name=job_name, root=self.root, log=self.print)
        except RunnerError as exc:
            raise BackendError(str(exc)) from None
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
        try:
            record = store.read(name, self.root)
        except LookupError as exc:
            raise BackendError(str(exc)) from None
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
        if spec is not None:
            record = Supervisor(spec, runner_named(spec.runner), printer=self.console if logs else None).run()
        else:
            record = self._follow(name, logs, poll)
        return self._completed(name, record)

    def _completed(self, name: str, record: dict) -> dict:
        """The record of a Completed job; JobFailedError (reason, log file) for any other end."""
        if record["TrainingJobStatus"] != "Completed":
            raise JobFailedError(name, record["TrainingJobStatus"], record.get("FailureReason", ""),
                                 str(self._dir(name) / "logs" / "job.log"))
        return record

    def _follow(self, name: str, logs: bool, poll: float) -> dict:
        offset = 0
        while True:
            record = self.describe(name)
            if logs:
                offset = self._print_log(name, offset)
            if record["TrainingJobStatus"] in TERMINAL_STATUSES:
                if logs:
                    self._print_log(name, offset)
                return record
            time.sleep(poll)

    def _print_log(self, name: str, offset: int) -> int:
        path = self._dir(name) / "logs" / "job.log"
        if not path.is_file():
            return offset
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        for line in complete.decode("utf-8", "replace").splitlines():
            self.print(line)
        return offset + len(complete)

    def logs(self, name: str, follow: bool = False, poll: float = 1.0) -> None:
        self.describe(name)
        if follow:
            self._completed(name, self._follow(name, True, poll))
        else:
            self._print_log(name, 0)

    def stop(self, name: str) -> None:
        record = self.describe(name)
        if record["TrainingJobStatus"] in TERMINAL_STATUSES:
            raise BackendError(f"local job {name} has already ended ({record['TrainingJobStatus']})")
        pid = record.get("SupervisorPid")
        if not pid:
            raise BackendError(f"local job {name} has no supervisor to stop yet; try again in a moment")
        os.kill(pid, signal.SIGTERM)

    def list(self, status: str | None = None, name_contains: str | None = None, max_results: int = 50) -> list[dict]:
        return [{k: r.get(k) for k in ("TrainingJobName", "TrainingJobStatus", "CreationTime", "TrainingEndTime")}
                for r in store.list_jobs(self.root, status, name_contains, max_results)]


def run_summary(record: dict) -> dict:
    """First and last loss, steps and throughput from the job's metrics.jsonl (rank 0's, on algo-1)."""
    metrics = Path(record["LocalJobDir"]) / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl"
    if not metrics.is_file():
        return {}
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [r for r in rows if "loss" in r and "val_loss" not in r]
    if not train:
        return {}
    out = {"first_step": train[0]["step"], "first_loss": train[0]["loss"],
           "steps": train[-1]["step"], "last_loss": train[-1]["loss"]}
    if "tokens_per_s" in train[-1]:  # the running average, without the first (warm-up) step
        out["tokens_per_s"] = train[-1]["tokens_per_s"]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    if val:
        out["last_val_loss"] = val[-1]
    return out
