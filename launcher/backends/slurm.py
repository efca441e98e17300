"""Slurm jobs: the job directory is prepared as for local mode, on a file system every node sees
($SMLAUNCH_HOME), and `sbatch` runs it: the batch script starts smlaunch's supervisor on the first
node, which starts one bootstrap per node with `srun` (launcher/slurm/).

The record (job.json) says what the supervisor saw (training, the failing rank's traceback, the
artifacts); while the job waits or once it ended without the supervisor recording it (a node
failure, Slurm's time limit, `scancel` without smlaunch), `scontrol` says the rest. A job is
named by its smlaunch name or its Slurm job id (`slurm:1234`). docs/slurm.md has the details.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from launcher.backends.base import TERMINAL_STATUSES, BackendError, JobDryRun
from launcher.backends.jobdir import JobDirBackend
from launcher.config import ValidatedJob
from launcher.config.backends.slurm import SlurmSettings, node_gpus
from launcher.local import store
from launcher.local.spec import STOP_REQUEST, LocalJobSpec
from launcher.slurm import commands, script
from launcher.slurm.runner import SlurmRunner

WAITING = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")
RUNNING = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING")
# How Slurm's end states read as SageMaker's, when the supervisor could not record the end itself.
ENDED = {"COMPLETED": "Failed", "CANCELLED": "Stopped", "TIMEOUT": "Stopped", "PREEMPTED": "Stopped",
         "DEADLINE": "Stopped"}


def _settings(job: ValidatedJob) -> SlurmSettings:
    return job.config.slurm or SlurmSettings()


def _runner_settings(job: ValidatedJob) -> dict:
    """What the runner needs inside the allocation (stored in spec.json with the job)."""
    settings = _settings(job)
    accelerators = job.instance.accelerators if job.instance else None
    return {**settings.model_dump(), "gpus_per_node": node_gpus(settings, accelerators) or 0,
            "python": settings.python or sys.executable}


class SlurmBackend(JobDirBackend):
    name = "slurm"

    # --- submitting ----------------------------------------------------------------------
    def _script(self, job: ValidatedJob, spec, runner: SlurmRunner) -> str:
        return script.render(spec, _settings(job), runner.settings["gpus_per_node"], runner.settings["python"])

    def _runner_for(self, job: ValidatedJob) -> SlurmRunner:
        return SlurmRunner(_runner_settings(job))

    def _dry_run(self, job: ValidatedJob, spec, runner: SlurmRunner) -> JobDryRun:
        """The batch script and what it runs; nothing is written or submitted."""
        text = self._script(job, spec, runner)
        return JobDryRun(self.name, {"SlurmJob": {
            "TrainingJobName": spec.name, "JobDir": str(spec.job_dir), "Nodes": len(spec.hosts),
            "SpareNodes": _settings(job).spare_nodes,
            "ProcessesPerNode": spec.processes_per_host, "BatchScript": text,
            "HyperParameters": spec.hyperparameters, "Environment": spec.environment}}, text=text)

    def submit(self, job: ValidatedJob, job_name: str | None = None, *, detach: bool = False) -> str:
        """Prepare the job directory and sbatch it; the job runs in Slurm whether or not it is followed."""
        commands.run(["sbatch", "--version"])  # no Slurm client here: say so before anything is written
        spec, runner = self._prepare(job, job_name)
        path = spec.job_dir / script.SCRIPT_NAME
        path.write_text(self._script(job, spec, runner))
        try:
            job_id = commands.sbatch(str(path), str(spec.job_dir))
        except BackendError as exc:
            store.update(spec.job_dir, TrainingJobStatus="Failed", SecondaryStatus="Failed",
                         StatusMessage="sbatch refused the job", FailureReason=f"ClientError: {exc}",
                         TrainingEndTime=store.now())
            raise
        store.update(spec.job_dir, SlurmJobId=job_id, SecondaryStatus="Pending",
                     StatusMessage=f"Slurm job {job_id} submitted")
        return spec.name

    # --- following -----------------------------------------------------------------------
    def resolve(self, job: str) -> str:
        """The smlaunch name of a job given by name or Slurm job id."""
        if job.isdigit() and not store.exists(job, self.root):
            for record in store.list_jobs(self.root, None, None, None):
                if record.get("SlurmJobId") == job and store.backend_of(record) == self.name:
                    return record["TrainingJobName"]
            raise BackendError(f"no smlaunch job has Slurm job id {job} (in {store.jobs_root()})")
        return job

    def exists(self, name: str) -> bool:
        try:
            return super().exists(self.resolve(name))
        except BackendError:
            return False

    def attach_fields(self, desc: dict) -> dict[str, Any]:
        """The slurm section and processes per node too, as the job's spec.json kept them."""
        spec = LocalJobSpec.load(Path(desc["LocalJobDir"]))
        kept = {k: v for k, v in spec.runner_settings.items()
                if k in SlurmSettings.model_fields and v not in (None, [])}
        return {**super().attach_fields(desc), "slurm": kept, "processes_per_host": spec.processes_per_host}

    def how(self, record: dict) -> str:
        return f"Slurm job {record.get('SlurmJobId')}"

    def describe(self, name: str) -> dict:
        name = self.resolve(name)
        record = self._record(name)
        job_id = record.get("SlurmJobId")
        if record["TrainingJobStatus"] in TERMINAL_STATUSES or not job_id:
            return record
        state = commands.job_state(job_id)
        if state is not None and state.state in WAITING:
            return {**record, "SecondaryStatus": "Pending", "SlurmJobState": state.state, "SlurmReason": state.reason}
        if state is not None and state.state in RUNNING:
            return {**record, "SlurmJobState": state.state}
        return self._ended_unrecorded(name, record, job_id, state)

    def _ended_unrecorded(self, name: str, record: dict, job_id: str, state) -> dict:
        """Slurm ended the job and the supervisor recorded nothing (killed with its node, Slurm's
        time limit, an scancel that was not a stop): record what Slurm says, once."""
        fresh = store.read(name, self.root)  # the supervisor may have written its end meanwhile
        if fresh["TrainingJobStatus"] in TERMINAL_STATUSES:
            return fresh
        what = (f"Slurm job {job_id} ended {state.state} (reason {state.reason or 'none'}, exit code "
                f"{state.exit_code or '?'})" if state else f"Slurm no longer knows job {job_id}")
        status = ENDED.get(state.state, "Failed") if state else "Failed"
        return store.update(self._dir(name), TrainingJobStatus=status, SecondaryStatus=status,
                            StatusMessage=what, SlurmJobState=state.state if state else "UNKNOWN",
                            FailureReason=f"{what} before smlaunch's supervisor recorded an outcome; see "
                                          f"{self._dir(name) / 'logs'}/slurm-{job_id}.out",
                            TrainingEndTime=store.now())

    def wait(self, name: str, logs: bool = True, poll: float = 2.0) -> dict:
        return super().wait(self.resolve(name), logs, poll)

    def logs(self, name: str, follow: bool = False, poll: float = 2.0) -> None:
        super().logs(self.resolve(name), follow, poll)

    def stop(self, name: str) -> None:
        """Ask the job's supervisor (on the allocation's first node) to stop it as a SageMaker stop
        does: `scancel --signal=TERM` to every node's bootstrap, so the ranks checkpoint; SIGKILL
        after the grace period; artifacts packed; the job recorded Stopped. A job still waiting
        for nodes is cancelled: nothing runs yet, nothing needs saving."""
        name = self.resolve(name)
        record = self.describe(name)
        if record["TrainingJobStatus"] in TERMINAL_STATUSES:
            raise BackendError(f"Slurm job {name} has already ended ({record['TrainingJobStatus']})")
        if record.get("SlurmJobState") in WAITING:
            commands.run(["scancel", record["SlurmJobId"]])
            return
        # the supervisor runs on another machine: it reads the request from the shared job directory
        (self._dir(name) / STOP_REQUEST).write_text(store.now() + "\n")
