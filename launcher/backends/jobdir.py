"""What the local and Slurm backends share: their jobs live in smlaunch's job store.

Both prepare a job directory (launcher.local.prepare) and a supervisor
(launcher.local.supervise) runs it, here or in a Slurm allocation, writing `job.json` and the
merged `logs/job.log`. Following a job, printing its logs and listing jobs therefore read the same
files for both; only submitting, stopping and the part of the status the scheduler knows differ.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Imports inside functions: preparing a job loads the code bundle and request builders, which
# status, logs and list never need (CLI start-up).
from launcher.backends import jobmetrics
from launcher.backends.base import TERMINAL_STATUSES, BackendError, JobDryRun, JobFailedError, Options
from launcher.backends.log_metrics import LogMetrics
from launcher.backends.metric_records import JobMetrics, jobdir_records, rank0_metrics
from launcher.config import ValidatedJob
from launcher.local import shrink, store
from launcher.local.restarts import job_restarts
from launcher.local.spec import LocalJobSpec, Runner, RunnerError
from launcher.wire.checkpoints import Checkpoint, latest_local
from launcher.wire.faults import Restart
from launcher.wire.goodput import Goodput, measure
from launcher.wire.metric_lines import DamagedMetrics, Progress, as_datetime, read_progress
from launcher.wire.terminal import printable

# How long a follower waits, after a job is recorded Failed while its other hosts are stopped, for
# the outcome: past torchrun's 100 s shutdown timeout, which bounds the stopping hosts.
OUTCOME_WAIT_S = 150


class JobDirBackend:
    name = ""  # "local" or "slurm": the `Backend` field of the records this backend owns
    unlisted: list[str] = []  # set by `list`: what it left out and why

    def __init__(self, root: Path | None = None, printer: Callable[[str], None] | None = None):
        self.root = root
        self.print = printer or print

    @classmethod
    def create(cls, options: Options) -> JobDirBackend:
        return cls(printer=options.printer)

    # --- submitting: a job directory prepared for this backend's runner --------------------
    def _runner_for(self, job: ValidatedJob) -> Runner:
        raise NotImplementedError

    def _dry_run(self, job: ValidatedJob, spec: LocalJobSpec, runner: Runner) -> JobDryRun:
        """The backend's dry-run request for a checked, unwritten job directory."""
        raise NotImplementedError

    def dryrun(self, job: ValidatedJob, job_name: str | None = None) -> JobDryRun:
        """The job directory, hosts and hyperparameters submit would prepare, and what the backend
        would run; nothing is written."""
        # Imported when used: preparing a job loads the code bundle and the request builders,
        # which `status`, `logs` and `list` never need (CLI start-up).
        from launcher.backends.sourcedir import build_job_sourcedir
        from launcher.local.prepare import checked_spec

        runner = self._runner_for(job)
        try:
            spec = checked_spec(job, runner, job_name, self.root)
        except RunnerError as exc:
            raise BackendError(str(exc)) from None
        with tempfile.TemporaryDirectory() as tmp:  # built as submit builds it, to say what it holds
            bundle = build_job_sourcedir(job, Path(tmp) / "sourcedir.tar.gz")
        result = self._dry_run(job, spec, runner)
        result.request["SourceBundle"] = bundle.to_dict()
        result.bundle = bundle
        return result

    def _prepare(self, job: ValidatedJob, job_name: str | None) -> tuple[LocalJobSpec, Runner]:
        """Write the job directory (launcher.local.prepare) for this backend's runner."""
        from launcher.local.prepare import prepare  # as in dryrun: CLI start-up

        runner = self._runner_for(job)
        try:
            return prepare(job, runner, job_name=job_name, root=self.root, log=self.print), runner
        except RunnerError as exc:
            raise BackendError(str(exc)) from None

    def _dir(self, name: str) -> Path:
        return store.job_dir(name, self.root)

    def _record(self, name: str) -> dict:
        """The job's record, if this backend owns it; BackendError naming where it looked."""
        return store.owned_record(self.name, name, self.root)

    def resolve(self, job: str) -> str:
        """The job's name, given its name (or, for Slurm, its scheduler's id)."""
        return job

    def exists(self, name: str) -> bool:
        return store.owns(self.name, name, self.root)

    def artifacts(self, name: str) -> dict[str, str]:
        """Where the job's model.tar.gz and output.tar.gz are (once it has ended): those in S3, and
        the local ones that exist and hold a file (jobs before smlaunch left out empty models)."""
        stored = self.describe(name).get("OutputArtifacts") or {}
        return {k: v for k, v in stored.items() if v.startswith("s3://") or _holds_a_file(Path(v))}

    def progress(self, name: str) -> Progress | None:
        """Rank 0's progress.json, next to its metrics.jsonl: on the newest host rank 0 ran on that has one
        (a shrink that lost rank 0's host moves it; until the next attempt's first step, the last one's)."""
        name = self.resolve(name)
        metrics = rank0_metrics(self._dir(name), self._record(name))  # this backend's job, or BackendError
        return next((p for path in reversed(metrics) if (p := read_progress(path.parent))), None)

    def checkpoint(self, name: str) -> Checkpoint | None:
        """The newest complete checkpoint in the job's checkpoint directory (shared by its hosts)."""
        name = self.resolve(name)
        config = self._record(name).get("CheckpointConfig") or {}
        directory = Path(config.get("LocalPath") or self._dir(name) / "checkpoints")
        return latest_local(directory, config.get("S3Uri") or None)

    def goodput(self, name: str) -> Goodput | None:
        """From the hosts' records (the supervisor's of a lost host among them: launcher.local.restarts),
        over the job's training time so far (to its end once it has one)."""
        name = self.resolve(name)
        record = self._record(name)
        started = as_datetime(record.get("TrainingStartTime"))
        if started is None:
            return None
        return measure(list(self.output_data_dirs(name).values()), started, as_datetime(record.get("TrainingEndTime")))

    def restarts(self, name: str) -> list[Restart]:
        """The job's failed attempts: its hosts' bootstraps' records and its supervisor's."""
        return job_restarts(list(self.output_data_dirs(name).values()))

    def metrics(self, name: str, logs: dict[str, LogMetrics] | None = None) -> JobMetrics:
        """Rank 0's metrics.jsonl in the job directory, or metric_definitions over its log (jobmetrics)."""
        return jobmetrics.from_job_dir(self, self.resolve(name), logs)

    def attach_fields(self, desc: dict) -> dict[str, Any]:
        """The backend, and the code as the first host got it."""
        return {"source_dir": str(Path(desc["LocalJobDir"]) / "hosts" / "algo-1" / "code"), "backend": self.name}

    def job_dir(self, name: str) -> Path:
        return self._dir(self.resolve(name))

    def output_data_dirs(self, name: str) -> dict[str, Path]:
        """{host: its output data directory} (`hosts/<host>/output/data`, where diagnostics/ is)."""
        name = self.resolve(name)
        self._record(name)  # this backend's job, or BackendError
        return {d.parents[1].name: d for d in sorted((self._dir(name) / "hosts").glob("*/output/data"))}

    # --- following -----------------------------------------------------------------------
    def _completed(self, name: str, record: dict, shown: bool) -> dict:
        """The record of a Completed job; JobFailedError (reason, log file) for any other end.
        `shown`: the job's log was printed, the failure report with it (JobFailedError)."""
        if record["TrainingJobStatus"] != "Completed":
            raise JobFailedError(name, record["TrainingJobStatus"], record.get("FailureReason", ""),
                                 str(self._dir(name) / "logs" / "job.log"), shown=shown)
        return record

    def _follow(self, name: str, logs: bool, poll: float) -> dict:
        offset, ended_at = 0, None
        while True:
            record = self.describe(name)
            if logs:
                offset = self._print_log(name, offset)
            if record["TrainingJobStatus"] in TERMINAL_STATUSES:
                ended_at = ended_at or time.monotonic()
                # Failed as its first host failed, the job is still stopping the others ("Stopping"): wait for
                # the outcome (end time, artifacts, the other hosts' logs), unless its supervisor never writes it
                if record.get("SecondaryStatus") != "Stopping" or time.monotonic() - ended_at > OUTCOME_WAIT_S:
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
            self.print(printable(line))
        return offset + len(complete)

    def wait(self, name: str, logs: bool = True, poll: float = 1.0) -> dict:
        """Follow the job to its end; raise JobFailedError if it fails or is stopped."""
        return self._completed(name, self._follow(name, logs, poll), shown=logs)

    def interrupted(self, name: str) -> str | None:
        return None  # followed from here, run elsewhere (its supervisor's own process, the Slurm allocation)

    def logs(self, name: str, follow: bool = False, poll: float = 1.0) -> None:
        self.describe(name)
        if follow:
            self._completed(name, self._follow(name, True, poll), shown=True)
        else:
            self._print_log(name, 0)

    def list(self, status: str | None = None, name_contains: str | None = None, max_results: int = 50) -> list[dict]:
        """The jobs, newest first. Records that could not be listed (damaged, or their job deleted
        while listing) are left out and said in `unlisted`, so one bad record hides no other job;
        so is a goodput not measured (damaged metrics)."""
        rows, damaged, vanished, notes = [], [], 0, []
        for record in store.list_jobs(self.root, None, name_contains, None, damaged=damaged):
            if store.backend_of(record) != self.name:
                continue
            try:
                record = self.describe(record["TrainingJobName"])  # the scheduler may know more than the file
            except store.DamagedRecord as exc:  # damaged between the listing and now
                damaged.append(str(exc).split(" is damaged")[0])
                continue
            except BackendError:
                if self._dir(record["TrainingJobName"]).is_dir():
                    raise
                vanished += 1  # deleted while listing: it is no job any more
                continue
            if status and record["TrainingJobStatus"] != status:
                continue
            rows.append(self._row(record, notes))
        self.unlisted = [f"{len(damaged)} damaged job record(s) not listed: {', '.join(damaged)}"] if damaged else []
        if vanished:
            self.unlisted.append(f"{vanished} job(s) deleted while listing, not listed")
        self.unlisted += notes
        return rows[:max_results]

    def _row(self, record: dict, notes: list[str]) -> dict:
        """A job's row of `list`: its record's times and status, its restarts and its goodput."""
        name = record["TrainingJobName"]
        row = {k: record.get(k) for k in ("TrainingJobName", "TrainingJobStatus", "CreationTime",
                                            "TrainingEndTime", "TrainingStartTime")}
        restarted = sum(1 for r in self.restarts(name) if r.restarted)
        if restarted:
            row["Restarts"] = restarted
        if record.get(shrink.SHRINKS):  # it went on with fewer hosts (min_instance_count)
            row[shrink.SHRINKS] = record[shrink.SHRINKS]
        try:
            measured = self.goodput(name)  # smlaunch's runtime's jobs: its time ledger
        except DamagedMetrics as exc:  # the job is listed all the same; the note says why it has no goodput
            notes.append(f"{name}: goodput not measured: {exc}")
            measured = None
        if measured is not None:
            row["Goodput"] = round(measured.fraction, 4)
        return row


def _holds_a_file(archive: Path) -> bool:
    try:
        with tarfile.open(archive) as tar:
            return tar.next() is not None  # the first member only: a model archive may be large
    except (OSError, tarfile.TarError):
        return False


def run_summary(record: dict) -> dict:
    """First and last loss, steps and throughput from the job's metrics.jsonl (rank 0's: jobdir_records)."""
    rows, _ = jobdir_records(record)
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
