"""The process runner: one `python -m container train` per simulated host on this machine.

A job whose code has a requirements.txt runs in a Python environment of its own, built (or
reused) once before the hosts start, never in the Python that launched it
(launcher.local.jobenv); the bootstraps, torchrun and the ranks run with that environment's
interpreter, and the bootstraps skip their own pip install.

Each bootstrap gets its own `/opt/ml` tree (SAGEMAKER_BASE_DIR) and its host name from
`resourceconfig.json`, exactly as in a SageMaker container; only the rendezvous differs:
127.0.0.1 on a free port (SMLAUNCH_MASTER_ADDR/PORT) instead of `algo-1:7777`, and all hosts
share one checkpoint directory (SMLAUNCH_CHECKPOINT_DIR), as their S3 checkpoint prefix would be.

The hosts of a job that runs smlaunch's runtime fork their runtime agents from one template the runner
starts for them (container.distributed.zygote `--listen`, named in SMLAUNCH_AGENT_TEMPLATE): the
runtime and torch are imported once for the job, not once per host (~2.3 CPU s each); a host that
cannot reach it starts its own, as a container's bootstrap does.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
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
from launcher.wire.forked_ranks import TEMPLATE_ENV
from launcher.wire.opt_ml import REQUIREMENTS_INSTALLED_ENV, free_port

# Variables of the caller's shell that would point a bootstrap at another job (and smlaunch's
# control variables: launcher.wire.control_env).
_NOT_INHERITED = ("SM_", "SAGEMAKER_", "CUDA_VISIBLE_DEVICES")
TEMPLATE_READY_S = 10.0  # how long the hosts' agent template may take to listen before they start without it


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
    template: subprocess.Popen | None = None  # the hosts' agent template, while they run
    template_name = ""

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
        shared = {TEMPLATE_ENV: self._agent_template(spec, port)}
        started = []
        for host in spec.hosts:
            proc = subprocess.Popen(
                [self.python(), "-m", "container", "train"], cwd=spec.host_dir(host),
                env=self.environment(spec, host, port) | shared, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent(),  # noqa: PLW1509
            )
            started.append(HostProcess(host, proc))
        return started

    signal_hosts = staticmethod(signal_process_groups)
    host_lost = staticmethod(refuse_gone_host)

    def _agent_template(self, spec: LocalJobSpec, port: int) -> str:
        """The name of the hosts' agent template, started once for the job (and again after it died) with
        the first host's environment (whose mark makes it the job's: launcher.local.leftovers); it imports
        nothing until a bootstrap asks it for an agent, so a job of a script of its own costs it nothing.
        Its output (a failed import's traceback) goes to logs/agent-template.log."""
        if self.template is not None and self.template.poll() is None:
            return self.template_name
        self.template_name = f"smlaunch-{secrets.token_hex(8)}"
        logs = spec.job_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / "agent-template.log", "ab") as out:
            self.template = subprocess.Popen(
                [self.python(), "-u", "-m", "container.distributed.zygote", "--listen", self.template_name],
                cwd=spec.job_dir, env=self.environment(spec, spec.hosts[0], port), stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True,  # a stop of the hosts' groups does not reach it
            )
        wait_listening(self.template, self.template_name)
        return self.template_name

    def hosts_ended(self, spec: LocalJobSpec) -> None:
        """The hosts' agent template goes with them (it is the runner's, not a process the job left), and
        with it any handler not yet gone after its bootstrap (its process group: agents have sessions of
        their own, so one still running is found as the job's leftover)."""
        if self.template is not None:
            try:
                os.killpg(self.template.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.template.wait()
            self.template = None

    def cleanup(self, spec: LocalJobSpec) -> None:
        """The hosts' agent template, if still there; the rest is gone, and their files belong to the user."""
        self.hosts_ended(spec)


def wait_listening(template: subprocess.Popen, name: str) -> None:
    """Until the template accepts connections (a bootstrap that finds none starts its own template, so a
    template that never listens costs only this wait)."""
    deadline = time.monotonic() + TEMPLATE_READY_S
    while template.poll() is None and time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect("\0" + name)
                return
            except OSError:
                time.sleep(0.02)
