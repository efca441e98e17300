"""What a local job is once prepared, and what a runner must do with it.

The job directory (`<jobs root>/<job name>/`):

    job.json             status record, DescribeTrainingJob-shaped (launcher.local.store)
    env/                 a Slurm job's Python environment for its requirements.txt (launcher.local.jobenv;
                         the process runner keeps them in <home>/envs/ and reuses them)
    spec.json            this LocalJobSpec, so a detached supervisor can run the job (0600: it
                         holds the environment and hyperparameters, secrets included)
    sourcedir.tar.gz     the code archive, built exactly as for SageMaker
    hosts/algo-N/        one /opt/ml tree per simulated host (launcher.wire.opt_ml.write_opt_ml)
    checkpoints/         shared by every host (unless checkpoint_local_path names another place)
    data/<channel>/      channels downloaded from s3://
    logs/algo-N.log      each host's output; logs/job.log: all hosts merged, host-prefixed
    output/              model.tar.gz and output.tar.gz when output_path is not set
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from launcher.wire.faults import ATTEMPT_ENV, HOST_GONE
from launcher.wire.opt_ml import TENSORBOARD_LOCAL_PATH, write_private
from launcher.wire.training.shrink import ORIGINAL_WORLD_ENV

SPEC_FILE = "spec.json"
# Written in the job directory to ask its supervisor to stop the job, as SIGTERM to it does: for a
# supervisor on another machine (a Slurm job's), which a signal from here cannot reach.
STOP_REQUEST = "stop-requested"
# Written beside it by whoever stops the job for a reason of its own (a sweep's early stopping):
# the supervisor records that text as the stopped job's StopReason, instead of "Stopped by the user".
STOP_REASON = "stop-reason"


def stop_reason(job_dir: Path) -> str | None:
    try:
        return (job_dir / STOP_REASON).read_text(encoding="utf-8").strip()[:1024] or None
    except OSError:
        return None


@dataclass
class LocalJobSpec:
    name: str
    job_dir: Path
    hosts: list[str]  # ["algo-1", ..., "algo-N"], sorted as SageMaker sorts them
    instance_type: str  # "local" or "local_gpu"
    processes_per_host: int
    hyperparameters: dict[str, str]  # wire-encoded, as in hyperparameters.json (runner-independent part)
    channels: dict[str, Path]  # channel name -> local file or directory (after any s3 download)
    environment: dict[str, str]  # the job's `environment`
    checkpoint_dir: Path  # shared by all hosts
    max_run: int  # seconds
    max_restarts: int = 0  # the job's (launcher.config.restarts); the hosts get it in `environment`
    attempt: int = 0  # the attempt the hosts start at: after the supervisor restarted the job, > 0
    min_instance_count: int = 0  # the job's: it goes on with this many hosts when one is gone (0: it does not)
    shrunk_from: int = 0  # the job's hosts before it went on with fewer (launcher.local.shrink; 0: it did not)
    image: str | None = None  # docker runner only
    gpus_per_host: list[list[int]] = field(default_factory=list)  # local_gpu: device indices per host
    runner: str = "process"
    output_path: str | None = None  # an absolute directory or s3://...; None: <job_dir>/output
    checkpoint_s3_uri: str | None = None  # synced with checkpoint_dir before and after the run
    region: str | None = None
    # ShardedByS3Key channels: host -> channel -> that host's part (replaces channels[name])
    host_channels: dict[str, dict[str, Path]] = field(default_factory=dict)
    runner_settings: dict = field(default_factory=dict)  # the Slurm runner's: the job's slurm section
    tensorboard: dict | None = None  # the request's TensorBoardOutputConfig (S3OutputPath, LocalPath)
    # requirements.txt's environment (launcher.local.jobenv): where the process runner keeps them, and
    # the constraints pip gets for a job that runs smlaunch's runtime (its own requirements)
    envs_root: str | None = None
    runtime_constraints: list[str] = field(default_factory=list)

    def host_dir(self, host: str) -> Path:
        """The host's /opt/ml tree."""
        return self.job_dir / "hosts" / host

    def every_host(self) -> list[str]:
        """The hosts the job has, then those it went on without (launcher.local.shrink): whose trees hold
        its output too."""
        gone = sorted(p.name for p in (self.job_dir / "hosts").glob("*") if p.name not in self.hosts)
        return self.hosts + gone

    @property
    def source_archive(self) -> Path:
        return self.job_dir / "sourcedir.tar.gz"

    def tensorboard_output(self, host: str) -> tuple[Path, str] | None:
        """(`host`'s TensorBoard directory here, its S3 prefix) of a job with a TensorBoardOutputConfig: rank 0
        writes it, on each host it ran on (launcher.local.shrink.rank0_hosts). The prefix is
        <S3OutputPath>/<job>/tensorboard-output, where the SageMaker SDK's `latest_job_tensorboard_artifacts_path`
        looks."""
        if not self.tensorboard:
            return None
        local = PurePosixPath(self.tensorboard.get("LocalPath") or TENSORBOARD_LOCAL_PATH)
        directory = (self.host_dir(host) / local.relative_to("/opt/ml")
                     if local.is_relative_to("/opt/ml") else Path(local))
        return directory, f"{self.tensorboard['S3OutputPath'].rstrip('/')}/{self.name}/tensorboard-output"

    def channels_of(self, host: str) -> dict[str, Path]:
        return {**self.channels, **self.host_channels.get(host, {})}

    def save(self) -> None:
        write_private(self.job_dir / SPEC_FILE, json.dumps(asdict(self), indent=2, default=str) + "\n")

    @classmethod
    def load(cls, job_dir: Path) -> LocalJobSpec:
        data = json.loads((Path(job_dir) / SPEC_FILE).read_text())
        data["job_dir"] = Path(data["job_dir"])
        data["checkpoint_dir"] = Path(data["checkpoint_dir"])
        data["channels"] = {k: Path(v) for k, v in data["channels"].items()}
        data["host_channels"] = {h: {k: Path(v) for k, v in c.items()} for h, c in data["host_channels"].items()}
        return cls(**data)


@dataclass
class HostProcess:
    """One process the supervisor follows: its label in the merged log and the process.

    The process runs in its own session (start_new_session=True), with stdout a pipe and
    stderr merged into it, so that the supervisor can signal its whole process group.
    """

    label: str
    proc: subprocess.Popen


class Runner(Protocol):
    name: str
    backend: str  # the backend whose jobs it runs: "local", or "slurm" for the Slurm runner
    # resourceconfig.json's network_interface_name: the interface the hosts reach each other on,
    # which torchrun jobs get as NCCL_SOCKET_IFNAME (container.toolkit.torchrun_env)
    network_interface_name: str

    def submit_directory(self, spec: LocalJobSpec) -> str:
        """The value of `sagemaker_submit_directory` as the bootstrap will see it."""

    def check(self, spec: LocalJobSpec) -> None:
        """Raise RunnerError with a clear message if this runner cannot run here (no engine)."""

    def setup(self, spec: LocalJobSpec, log: Callable[[str], None], should_stop: Callable[[], bool]) -> dict | None:
        """Before any host starts: the job's Python environment for its requirements.txt
        (launcher.local.jobenv), or nothing where the hosts install it themselves (containers).
        Returns what job.json records about it; raises jobenv.RequirementsFailed or SetupStopped."""

    def start(self, spec: LocalJobSpec) -> list[HostProcess]:
        """Start the job (the trees under spec.job_dir / "hosts" are written)."""

    def signal_hosts(self, hosts: list[HostProcess], signum: int) -> None:
        """Send `signum` to every host still running (SIGTERM: stop and checkpoint; SIGKILL: now)."""

    def hosts_ended(self, spec: LocalJobSpec) -> None:
        """The hosts have ended (before the processes the job left are looked for): end what the runner
        ran beside them (the process runner's agent template)."""

    def cleanup(self, spec: LocalJobSpec) -> None:
        """After every process ended (or was killed): release what start() created."""


def attempt_environment(spec: LocalJobSpec) -> dict[str, str]:
    """The attempt the hosts start at, after the supervisor restarted the job (launcher.wire.faults), and
    the job's original world once it went on with fewer hosts (launcher.wire.training.shrink)."""
    env = {ATTEMPT_ENV: str(spec.attempt)} if spec.attempt else {}
    if spec.shrunk_from:
        env[ORIGINAL_WORLD_ENV] = str(spec.shrunk_from * spec.processes_per_host)
    return env


def refuse_gone_host(spec: LocalJobSpec, label: str) -> str:
    """A simulated host's `host_lost`: it runs again where it ran, unless a host-gone fault injection
    marked it as one that cannot come back (RunnerError)."""
    if (spec.host_dir(label) / HOST_GONE).exists():
        raise RunnerError(f"{label} cannot come back (its {HOST_GONE} fault injection)")
    return ""


def signal_process_groups(hosts: list[HostProcess], signum: int) -> None:
    """`signum` to the process group of every host still running (each host is a session leader)."""
    for host in hosts:
        if host.proc.poll() is None:
            try:
                os.killpg(host.proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


class RunnerError(RuntimeError):
    """The runner cannot run the job here; the message says why and what to do."""
