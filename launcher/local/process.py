"""The process runner: one `python -m container train` per simulated host on this machine.

A job whose code has a requirements.txt runs in a Python environment of its own, built (or
reused) once before the hosts start, never in the Python that launched it
(launcher.local.jobenv); the bootstraps, torchrun and the ranks run with that environment's
interpreter, and the bootstraps skip their own pip install.

Each bootstrap gets its own `/opt/ml` tree (SAGEMAKER_BASE_DIR) and its host name from
`resourceconfig.json`, exactly as in a SageMaker container; only the rendezvous differs:
127.0.0.1 on a free port (SMLAUNCH_MASTER_ADDR/PORT) instead of `algo-1:7777`, and all hosts
share one checkpoint directory (SMLAUNCH_CHECKPOINT_DIR), as their S3 checkpoint prefix would be.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from launcher.local import jobenv, leftovers, store
from launcher.local.spec import (
    HostProcess,
    LocalJobSpec,
    RunnerError,
    attempt_environment,
    refuse_gone_host,
    signal_process_groups,
)
from launcher.wire.control_env import without_control
from launcher.wire.opt_ml import REQUIREMENTS_INSTALLED_ENV, free_port

# Variables of the caller's shell that would point a bootstrap at another job (and smlaunch's
# control variables: launcher.wire.control_env).
_NOT_INHERITED = ("SM_", "SAGEMAKER_", "CUDA_VISIBLE_DEVICES")


def _die_with_parent():
    """Linux: a bootstrap whose supervisor is killed gets SIGTERM and stops its ranks."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None).prctl
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ProcessRunner:
    name = "process"
    backend = "local"  # the job record's Backend: local mode, whichever runner
    network_interface_name = "lo"  # the hosts meet on 127.0.0.1
    job_env: jobenv.JobEnvironment | None = None  # set by setup when the code has a requirements.txt

    def submit_directory(self, spec: LocalJobSpec) -> str:
        # A plain path of the tar.gz, which the toolkit's files.download_and_extract reads too
        # (a file:// URI it cannot open); every host extracts it into its own code/ directory.
        return str(spec.source_archive)

    def check(self, spec: LocalJobSpec) -> None:
        missing = [m for m in ("torch", "container") if importlib.util.find_spec(m) is None]
        if missing:
            raise RunnerError(f"local mode trains on this machine, but {', '.join(missing)} is not installed "
                              f"in {sys.executable}: pip install 'smlaunch[train]' (brings torch), "
                              "or use the docker runner")

    def setup(self, spec: LocalJobSpec, log: Callable[[str], None], should_stop: Callable[[], bool]) -> dict | None:
        """The job's environment for its requirements.txt, kept in <home>/envs/ and reused by the next
        job with the same requirements and launching Python."""
        root = Path(spec.envs_root) if spec.envs_root else store.envs_root()
        self.job_env = jobenv.job_environment(spec, python=sys.executable, log=log, should_stop=should_stop,
                                              place=lambda key: root / key[:jobenv.KEY_CHARS])
        return self.job_env.record() if self.job_env else None

    def python(self) -> str:
        """The interpreter of the hosts' bootstraps (and so of torchrun and the ranks)."""
        return str(self.job_env.python) if self.job_env else sys.executable

    def environment(self, spec: LocalJobSpec, host: str, port: int) -> dict[str, str]:
        env = {k: v for k, v in without_control(os.environ).items() if not k.startswith(_NOT_INHERITED)}
        env.update(spec.environment)
        env.update(attempt_environment(spec))
        env.update(leftovers.mark(spec.job_dir))  # every process of the job can be found and ended
        env.update(SAGEMAKER_BASE_DIR=str(spec.host_dir(host)), SMLAUNCH_MASTER_ADDR="127.0.0.1",
                   SMLAUNCH_MASTER_PORT=str(port), SMLAUNCH_CHECKPOINT_DIR=str(spec.checkpoint_dir),
                   PYTHONUNBUFFERED="1")
        if self.job_env:  # installed already: the bootstraps must not run pip again, each at once
            env[REQUIREMENTS_INSTALLED_ENV] = self.job_env.requirements_sha256
        if spec.gpus_per_host:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus_per_host[spec.hosts.index(host)]))
        return env

    def start(self, spec: LocalJobSpec) -> list[HostProcess]:
        port = free_port()
        started = []
        for host in spec.hosts:
            proc = subprocess.Popen(
                [self.python(), "-m", "container", "train"], cwd=spec.host_dir(host),
                env=self.environment(spec, host, port), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent(),  # noqa: PLW1509
            )
            started.append(HostProcess(host, proc))
        return started

    signal_hosts = staticmethod(signal_process_groups)
    host_lost = staticmethod(refuse_gone_host)

    def cleanup(self, spec: LocalJobSpec) -> None:
        """Nothing: the processes are gone and their files belong to the user."""
