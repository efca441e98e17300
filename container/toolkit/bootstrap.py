"""The training image's `train` command: fetch the code, launch the script, report the outcome.

As the sagemaker-training toolkit does on AWS's PyTorch images (docs/sagemaker-contract.md,
docs/container.md): the code from `sagemaker_submit_directory` goes to `<base>/code`
(container.toolkit.code fetches it and installs its requirements.txt), where
torchrun (torch_distributed) or `python <program>` runs it with the `SM_*` environment and the
user hyperparameters as arguments. `<base>/output/failure` (SageMaker shows its first 1024
characters as FailureReason) begins as the toolkit's does (`ExecuteUserScriptError:`,
`ExitCode N`, `ErrorMessage "..."`), and its message leads with the failing rank, its host and
exit code and the exception, then the last frames of the traceback.

The ranks' output reaches the console as the script printed it, without torchrun's `[default0]:`
prefixes (container.toolkit.rank_logs), and the NCCL/EFA variables are the toolkit's for the instance
type (container.toolkit.torchrun_env). docs/container.md lists where this bootstrap and the toolkit differ.

A torchrun failure is captured without the script's help (no `@record`): torchrun's summary,
the last lines of its stderr (which passes through here), names the first failing rank and its
exit code, and that rank's traceback is read from its stderr file (`--log-dir`, `--redirects 3`).
torchrun exits 1 for any failure or signal, so the bootstrap exits with the failing rank's code
(128 + N if signal N killed it), or 128 + N when the bootstrap itself was stopped by signal N:
a stop is no failure, so it leaves no failure file and logs `stopped (exit code 143)`.

Secrets never leave in the clear (launcher.wire.masking, docs/secrets.md): the values of the job's
secret-named hyperparameters and environment variables, and URL passwords, are masked in the
launch command, every `[smlaunch]` line, pip's output, the failure file, the command's stdout and
stderr and the ranks' output, including what the script itself prints.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from container.toolkit.code import RequirementsError, fetch_code, install_requirements
from container.toolkit.console import log
from container.toolkit.contract import (
    ContractError,
    TrainingEnv,
    base_dir_from_env,
    read_training_env,
    sm_environment,
    to_cmd_args,
)
from container.toolkit.failure_report import (
    exit_code,
    failure_text,
    toolkit_error,
)
from container.toolkit.frozen_ranks import FrozenRanks
from container.toolkit.rank_logs import RankLogs, rank_stderr
from container.toolkit.stop_traceback import StopTraceback
from container.toolkit.torchrun_env import torchrun_variables
from launcher.wire import masking
from launcher.wire.hyperparameters import PROCESSES_PER_HOST
from launcher.wire.opt_ml import FAILURE_LIMIT, free_port, process_ended

MASTER_PORT = 7777  # the toolkit's torchrun master port on multi-host jobs
SHUTDOWN_TIMEOUT_S = 100  # seconds ranks get between SIGTERM and SIGKILL (torchrun default: 30)
EXIT_CONTRACT_ERROR = 2  # the job cannot run as described (usage error, as in the CLI)
STDERR_TAIL_BYTES = 64 * 1024  # enough for torchrun's failure summary of a full host
# Once the entry process (or torchrun) has exited, its last output may still be in the pipes: read
# for this long; a process it left running that still holds them (a TensorBoard, `nvidia-smi dmon &`)
# is then ended, so a finished job finishes.
DRAIN_GRACE_S = 5.0
LEFTOVER_GRACE_S = 2.0  # SIGTERM to SIGKILL for those leftovers
_UNSUPPORTED = {
    "sagemaker_mpi_enabled": "MPI (distribution={'mpi': ...})",
    "sagemaker_distributed_dataparallel_enabled": "SageMaker distributed data parallel (smddp)",
}
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)"
    r".*?exitcode\s*:\s*(-?\d+)",
    re.DOTALL,
)


def train(base_dir: Path | None = None) -> int:
    """Run the training job of this host; returns the exit code for the image's `train`."""
    output_dir = (Path(base_dir) if base_dir else base_dir_from_env()) / "output"
    for marker in ("success", "failure"):
        (output_dir / marker).unlink(missing_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="smlaunch-ranks-"))
    masking.install(masking.Masker.of(dict(os.environ)))  # until the hyperparameters are read
    try:
        try:
            env = read_training_env(base_dir)
            masking.install(masking.Masker.of(dict(os.environ), env.hyperparameters))
            fetch_code(env)
            install_requirements(env)
            cmd = launch_command(env, log_dir)
            shown = masking.mask_command(cmd, masking.installed())
            log(f"{env.current_host}: {shlex.join(shown)} (in {env.code_dir})")
            child = Child(cmd, cwd=env.code_dir, env=child_environment(env),
                          rank_logs=log_dir if uses_torchrun(env) else None)
        except RequirementsError as exc:
            return _report(output_dir, exc.code, str(exc))
        except Exception as exc:  # noqa: BLE001 - every way the job cannot start must reach output/failure
            code = EXIT_CONTRACT_ERROR if isinstance(exc, ContractError) else 1
            return _report(output_dir, code, f"{type(exc).__name__}: {exc}")
        returncode = child.wait()
        if returncode == 0:
            return _report(output_dir, 0, "")
        if child.signals:
            return _stopped(env, child, returncode)
        code, message = _diagnose(env, child, returncode, log_dir)
        return _report(output_dir, code, toolkit_error("ExecuteUserScriptError", code, message, shown))
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def _report(output_dir: Path, code: int, failure: str) -> int:
    output_dir.mkdir(parents=True, exist_ok=True)
    if code == 0:
        (output_dir / "success").write_text("")
    else:
        # Masked before it is cut: a cut could leave the start of a secret that no longer matches.
        failure = masking.installed()(failure)[:FAILURE_LIMIT]
        (output_dir / "failure").write_text(failure, encoding="utf-8")
        log(f"failed (exit code {code}):\n{failure}")
    return code


# --- the command ----------------------------------------------------------------------------

def launch_command(env: TrainingEnv, log_dir: Path) -> list[str]:
    """torchrun where `uses_torchrun`, else `python <program> <args>` (run in code_dir)."""
    for flag, name in _UNSUPPORTED.items():
        if env.hyperparameters.get(flag):
            raise ContractError(
                f"{name} is not supported by this image ({flag}); use "
                "distribution={'torch_distributed': {'enabled': True}}"
            )
    program = _program(env)
    args = to_cmd_args(env.user_hyperparameters)
    if not uses_torchrun(env):
        return [sys.executable, program, *args]
    addr, port = master_address(env)
    hosts = env.distribution_hosts  # the toolkit's torchrun hosts: those of the distribution groups
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(len(hosts)),
        "--nproc_per_node", str(processes_per_host(env)),
        "--master_addr", addr,
        "--master_port", str(port),
        "--node_rank", str(hosts.index(env.current_host)),
        # Each rank's stdout and stderr in files only: container.toolkit.rank_logs passes them on
        # unprefixed (`--tee` would prefix every line) and reads a failing rank's traceback back.
        "--log-dir", str(log_dir),
        "--redirects", "3",
        # SageMaker kills ~120 s after SIGTERM; torchrun's default 30 s is too short for ranks
        # to save a checkpoint of a large model first.
        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
        program, *args,
    ]


def uses_torchrun(env: TrainingEnv) -> bool:
    """torch_distributed on a host of a distribution instance group, as AWS's PyTorch images
    decide (sagemaker_pytorch_container.training.train): other hosts run `python <program>`."""
    return env.torch_distributed and env.current_host in env.distribution_hosts


def _program(env: TrainingEnv) -> str:
    program = env.user_entry_point
    if not program:
        raise ContractError("no sagemaker_program hyperparameter: which script should run?")
    if not (env.code_dir / program).is_file():
        found = sorted(p.name for p in env.code_dir.iterdir())
        listing = ", ".join(found[:20]) + (", ..." if len(found) > 20 else "") or "nothing"
        raise ContractError(
            f"sagemaker_program {program!r} not found in {env.code_dir} "
            f"(code from {env.module_dir}); it holds: {listing}"
        )
    return program


def processes_per_host(env: TrainingEnv) -> int:
    """One rank per GPU; on CPU hosts `sagemaker_smlaunch_processes_per_host` (default 1)."""
    if env.num_gpus > 0:
        return env.num_gpus
    value = env.hyperparameters.get(PROCESSES_PER_HOST, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ContractError(f"{PROCESSES_PER_HOST} must be an integer >= 1, got {value!r}")
    return value


def master_address(env: TrainingEnv) -> tuple[str, int]:
    """torchrun's static rendezvous: the first host at port 7777, as the toolkit launches it.

    SMLAUNCH_MASTER_ADDR / SMLAUNCH_MASTER_PORT override both, so that several simulated hosts
    can share one machine. A single host is its own master: 127.0.0.1 on a free port, so
    single-host jobs side by side do not collide.
    """
    addr = os.environ.get("SMLAUNCH_MASTER_ADDR")
    port = os.environ.get("SMLAUNCH_MASTER_PORT")
    if len(env.distribution_hosts) == 1:
        return addr or "127.0.0.1", int(port) if port else free_port()
    return addr or env.master_hostname, int(port) if port else MASTER_PORT


def child_environment(env: TrainingEnv) -> dict[str, str]:
    """This process's environment plus the SM_* variables, PYTHONPATH and the NCCL/EFA settings."""
    child = dict(os.environ)
    child.update(sm_environment(env))
    # The toolkit exports these three into its own environment, so scripts inherit them.
    child["CURRENT_HOST"] = env.current_host
    child["SAGEMAKER_JOB_NAME"] = str(env.hyperparameters.get("sagemaker_job_name", ""))
    child["SAGEMAKER_REGION"] = str(
        env.hyperparameters.get("sagemaker_region")
        or os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", ""))
    )
    # The code first, then everything importable here (the toolkit passes on its sys.path the
    # same way), so the script can import its own modules and this project's packages.
    paths = [str(env.code_dir)] + [os.path.abspath(p) for p in sys.path if p]
    child["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if uses_torchrun(env):  # over the job's own values, as the toolkit assigns them
        child.update(torchrun_variables(env.current_instance_type, env.network_interface_name))
    return child


# --- running it ------------------------------------------------------------------------------

class Child:
    """The launched command: SIGTERM/SIGINT forwarded to it, its stdout and stderr streamed
    (masked) and the end of its stderr kept, and with `rank_logs` (torchrun's --log-dir) the
    ranks' output streamed from their files.

    It runs in its own session, so a terminal's Ctrl-C reaches it once (through us), and signals
    go to its whole process group. torchrun forwards them to every rank (each rank runs in a
    session of its own) and stops the ranks; a single-process script gets them directly.
    """

    def __init__(self, cmd: list[str], *, cwd: Path, env: dict[str, str], rank_logs: Path | None = None):
        self.signals: list[int] = []
        self.stderr_tail = b""
        self._proc: subprocess.Popen | None = None
        self._previous = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)
        }
        # preexec_fn is safe here: this process runs no other thread yet (the pumps start below).
        self._proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509
        )
        for signum in self.signals:  # arrived while the process was being started
            self._forward(signum)
        # torchrun's traceback of a stop we forwarded is no news (container.toolkit.stop_traceback)
        quiet = StopTraceback(lambda: bool(self.signals)) if rank_logs else None
        self._pumps = [
            threading.Thread(target=self._copy, args=(self._proc.stdout, sys.stdout.buffer, False), daemon=True),
            threading.Thread(target=self._copy, args=(self._proc.stderr, sys.stderr.buffer, True, quiet),
                             daemon=True),
        ]
        for pump in self._pumps:
            pump.start()
        self._ranks = RankLogs(rank_logs).start() if rank_logs else None
        # Under torchrun (rank_logs): a rank stopped while its peers end is continued, then killed.
        self.frozen = FrozenRanks(self._proc.pid, log).start() if rank_logs else None

    def _on_signal(self, signum: int, _frame) -> None:
        self.signals.append(signum)
        if self._proc is not None:
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        try:
            os.killpg(self._proc.pid, signum)
        except ProcessLookupError:  # already gone
            pass

    def _copy(self, src, dst, keep_tail: bool, quiet: StopTraceback | None = None) -> None:
        # Chunks, not lines: progress bars that redraw with \r must show up as they happen. Only
        # a chunk's tail that may begin a secret waits for the next chunk, so a secret cut in two
        # by the pipe is still masked.
        fd = src.fileno()
        masked = masking.StreamMasker(masking.installed())
        while chunk := os.read(fd, 65536):
            dst.write(masked.feed(quiet.feed(chunk) if quiet else chunk))
            dst.flush()
            if keep_tail:
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL_BYTES:]
        dst.write(masked.feed(quiet.feed(b"", final=True) if quiet else b"", final=True))
        dst.flush()

    def wait(self) -> int:
        """The entry process's exit code, once it has exited and its output is read (see DRAIN_GRACE_S)."""
        returncode = self._proc.wait()
        if self.frozen:
            self.frozen.stop()
        self._drain()
        if self._ranks:
            self._ranks.stop()
        for pump, pipe in zip(self._pumps, (self._proc.stdout, self._proc.stderr)):
            if not pump.is_alive():  # a pipe still being read is left to the process's exit
                pipe.close()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return returncode


    def _drain(self) -> None:
        """Read the pipes to their end; what still holds them after DRAIN_GRACE_S (processes the
        entry process started and left running) is ended: SIGTERM, then SIGKILL, to its process
        group. One that left the group (a session of its own) is no longer read; the job's
        supervisor ends it with the job's other leftovers."""
        if self._joined(DRAIN_GRACE_S):
            return
        log(f"the entry process exited, but processes it started still hold its output open: ending them "
            f"(process group {self._proc.pid})")
        for signum, grace in ((signal.SIGTERM, LEFTOVER_GRACE_S), (signal.SIGKILL, LEFTOVER_GRACE_S)):
            try:
                # The group outlives its leader while any member runs, so its id names no other process.
                os.killpg(self._proc.pid, signum)
            except ProcessLookupError:
                pass
            if self._joined(grace):
                return
        log("their output is no longer read: a process outside the entry process's group holds it")

    def _joined(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(deadline - time.monotonic(), 0))
        return not any(pump.is_alive() for pump in self._pumps)


def _die_with_parent():
    """Linux: should the bootstrap be SIGKILLed, the child gets SIGTERM (PR_SET_PDEATHSIG), so
    torchrun stops every rank rather than living on without a parent."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None).prctl  # looked up here: the forked child only makes the call
    return lambda: prctl(1, signal.SIGTERM)


def _stopped(env: TrainingEnv, child: Child, returncode: int) -> int:
    """A stop (StopTrainingJob, a spot interruption, `smlaunch stop`) is no failure: the exit code
    says which signal, and no output/failure is written, so nothing reports the job as failed."""
    name = signal.Signals(child.signals[0]).name
    code = 128 + child.signals[0] if uses_torchrun(env) else exit_code(returncode)
    log(f"stopped (exit code {code}): received {name} and forwarded it to every rank")
    return code


def _diagnose(env: TrainingEnv, child: Child, returncode: int, log_dir: Path) -> tuple[int, str]:
    """(exit code, failure text) for a child that failed on its own."""
    tail = child.stderr_tail.decode("utf-8", "replace")
    if not uses_torchrun(env):
        return exit_code(returncode), failure_text(
            f"{env.user_entry_point} {process_ended(returncode)}", tail
        )
    causes = _ROOT_CAUSE.findall(tail)
    if not causes:  # no summary: torchrun itself failed (bad arguments, rendezvous timeout)
        return exit_code(returncode), failure_text(f"torchrun {process_ended(returncode)}", tail)
    rank, local_rank, exitcode = (int(x) for x in causes[-1])
    header = f"rank {rank} (host {env.current_host}, local rank {local_rank}) {process_ended(exitcode)}"
    if child.frozen and child.frozen.frozen:  # they never answered: the collective that failed waited on them
        header = (f"{', '.join(child.frozen.frozen.values())} on host {env.current_host} did not report: stopped "
                  f"(SIGSTOP?) while its peers ran, so their collectives failed; first failure: {header}")
    return exit_code(exitcode), failure_text(header, rank_stderr(log_dir, local_rank))
