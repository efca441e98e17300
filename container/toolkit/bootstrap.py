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

import os
import re
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from container.toolkit.agent_template import Template
from container.toolkit.child import Child
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
from container.toolkit.diagnostics import collect_stacks, flight_recorder_environment, summarize
from container.toolkit.failure_report import (
    exit_code,
    failure_text,
    known_cause,
    rank_ended,
    toolkit_error,
)
from container.toolkit.rank_logs import rank_stderr
from container.toolkit.restarts import Failure, backoff_s, classify
from container.toolkit.script_watch import Silence
from container.toolkit.torchrun_env import torchrun_variables
from launcher.wire import faults, masking, restart_policy
from launcher.wire.diagnostics import attempt_dir
from launcher.wire.forked_ranks import RANKS_DIR_ENV, TEMPLATE_ENV
from launcher.wire.heartbeat import HEARTBEAT_DIR_ENV
from launcher.wire.hyperparameters import PROCESSES_PER_HOST
from launcher.wire.metric_lines import now
from launcher.wire.opt_ml import FAILURE_LIMIT, free_port, private_dir, process_ended, scratch_dir
from launcher.wire.restart_policy import PolicyError, RestartPolicy
from launcher.wire.runtime_script import PACKAGES_DIR, is_runtime

MASTER_PORT = 7777  # the toolkit's torchrun master port on multi-host jobs
SHUTDOWN_TIMEOUT_S = 100  # seconds ranks get between SIGTERM and SIGKILL (torchrun default: 30)
FROZEN_ALONE_S = 60.0  # a stopped rank with restarts on, where the job sets no step_timeout
EXIT_CONTRACT_ERROR = 2  # the job cannot run as described (usage error, as in the CLI)
# in an attempt's scratch: torchrun's --log-dir, SMLAUNCH_FAULT_DIR, SMLAUNCH_HEARTBEAT_DIR (launcher.wire.heartbeat)
_RANKS, _FAULTS, _BEATS = "ranks", "faults", "heartbeats"
# in the host's scratch: forked ranks' variables (launcher.wire.forked_ranks), one directory for every attempt
# (an agent forked from the template shows the first attempt's environment), emptied as each attempt starts
_FORKED = "forked"
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
    masking.install(masking.Masker.of(dict(os.environ)))  # until the hyperparameters are read
    try:
        env = read_training_env(base_dir)
        masking.install(masking.Masker.of(dict(os.environ), env.hyperparameters))
        policy = job_restart_policy()
        fetch_code(env)
        install_requirements(env)
    except RequirementsError as exc:
        return report(output_dir, exc.code, str(exc))
    except Exception as exc:  # noqa: BLE001 - every way the job cannot start must reach output/failure
        code = EXIT_CONTRACT_ERROR if isinstance(exc, ContractError) else 1
        return report(output_dir, code, f"{type(exc).__name__}: {exc}")
    return run_attempts(env, output_dir, policy)


def job_restart_policy() -> RestartPolicy:
    """The job's restart rules (launcher.wire.restart_policy; none when unset: fail at the first failure)."""
    try:
        return RestartPolicy.from_environment(os.environ)
    except PolicyError as exc:
        raise ContractError(str(exc)) from None


def run_attempts(env: TrainingEnv, output_dir: Path, policy: RestartPolicy) -> int:
    """Run the script; after a failure the classes of container.toolkit.restarts allow, run it
    again (torchrun's rendezvous on the next port, so no agent of the failed attempt is joined),
    as the job's rules allow: max_restarts counted over the whole job (SMLAUNCH_ATTEMPT: the attempts
    before this bootstrap's first, when the supervisor restarted the job). The code is in place: `train`
    fetched it, or AWS's toolkit did (container.toolkit.restart_loop). The host's scratch is gone
    when it returns, and so is what a bootstrap of this host killed before it left there."""
    shutil.rmtree(scratch_dir(env.base_dir), ignore_errors=True)
    # smlaunch's runtime: every attempt's agent forked from one template, which imports the runtime once
    template = Template(os.environ.get(TEMPLATE_ENV)) if preloads_runtime(env) else None
    try:
        return _run_attempts(env, output_dir, policy, template)
    finally:
        if template is not None:
            template.close()
        shutil.rmtree(scratch_dir(env.base_dir), ignore_errors=True)


def _run_attempts(env: TrainingEnv, output_dir: Path, policy: RestartPolicy, template: Template | None) -> int:
    earlier = faults.read_restarts(env.output_data_dir)
    # A host started again by something else than smlaunch (a Kubernetes JobSet's own restarts, which its
    # TTL can reset into an endless loop: kubeflow/trainer #3779) finds the job's records: its attempts go
    # on from them, so the job's restart count bounds it, and a job that ended is not run again.
    number = max([faults.attempt(), *(r.attempt + 1 for r in earlier)])
    ended = next((r for r in reversed(earlier) if not r.restarted), None)
    if ended is not None:
        return report(output_dir, 1, f"the job has ended: {ended.text()}; this host was started again by "
                                     "something else than smlaunch (a controller's own restart?), and does not run "
                                     "it again: submit the job again to resume from its newest checkpoint")
    while True:
        outcome = _attempt(env, output_dir, number, policy, template)
        if isinstance(outcome, int):
            return outcome
        failure, shown, scratch, seconds = outcome
        decision = classify(failure, faults.read_rank_failures(scratch / _FAULTS), earlier, policy)
        shutil.rmtree(scratch, ignore_errors=True)
        hang = summarize(attempt_dir(env.output_data_dir, number), log)  # which rank hung, where
        record = faults.Restart(
            attempt=number, at=now(), failure_class=decision.failure_class, reason=failure.header,
            host=env.current_host, restarted=decision.restart and allowed(decision, number, policy, earlier),
            rank=failure.rank, step=decision.step, resumed_from=decision.start_step, detail=decision.detail,
            seconds=round(seconds, 1), extra={"diagnosis": hang} if hang else {})
        faults.append_restart(env.output_data_dir, record)
        log(faults.restart_line(record))  # where status reads a running SageMaker job's restarts
        earlier.append(record)
        if not record.restarted:
            cause = known_cause(failure.exit_code, failure.stderr_tail)
            header = failure.header + (f"; hang diagnosis: {hang}" if hang else "") + _give_up(
                decision, number, policy, earlier) + (f"\n{cause}" if cause else "")
            message = failure_text(header, failure.stderr_tail)
            return report(output_dir, failure.exit_code,
                           toolkit_error("ExecuteUserScriptError", failure.exit_code, message, shown))
        pause = backoff_s(number + 1)
        log(f"{_restart_text(decision, number, policy, earlier)} in {pause:.0f} s: {record.text()} "
            f"[{decision.why}]; the run resumes from its newest verified checkpoint")
        time.sleep(pause)
        number += 1


def allowed(decision, number: int, policy: RestartPolicy, earlier: list[faults.Restart]) -> bool:
    """Whether a failure its class would restart still may be: an exit code the job lists while
    the job is under faults.MAX_RESTARTS attempts, any other while max_restarts are left
    (counted over the whole job: `earlier`, this bootstrap's records of the attempts before)."""
    if decision.failure_class == restart_policy.REQUESTED:
        return number < faults.MAX_RESTARTS
    return restart_policy.counted(number, earlier) < policy.max_restarts


def _restart_text(decision, number: int, policy: RestartPolicy, earlier: list[faults.Restart]) -> str:
    if decision.failure_class == restart_policy.REQUESTED:
        return f"restart (attempt {number + 1}; restart_on_exit_codes, not counted)"
    return f"restart {restart_policy.counted(number, earlier) + 1} of {policy.max_restarts} (max_restarts)"


def _attempt(env: TrainingEnv, output_dir: Path, number: int, policy: RestartPolicy, template: Template | None):
    """One run of the command: its exit code where the job ends here (success, a stop, a start
    that failed), else (Failure, the command as shown, the attempt's scratch, seconds)."""
    alone_s = frozen_alone_s(env) if policy.restarts_anything else None
    scratch = scratch_dir(env.base_dir) / f"attempt-{number}"
    log_dir, fault_dir = scratch / _RANKS, scratch / _FAULTS
    started = time.monotonic()
    try:
        try:
            _make_scratch(scratch)
            cmd = launch_command(env, log_dir, number)
            shown = masking.mask_command(cmd, masking.installed())
            attempt_note = f" (attempt {number})" if number else ""
            log(f"{env.current_host}{attempt_note}: {shlex.join(shown)} (in {env.code_dir})")
            hang_s = float(policy.hang_timeout) or None
            beats = {HEARTBEAT_DIR_ENV: str(scratch / _BEATS)} if hang_s else {}
            forked = {RANKS_DIR_ENV: str(scratch.parent / _FORKED)} if template else {}
            agent_env = child_environment(env, number, fault_dir) | beats | forked
            child = Child(cmd, cwd=env.code_dir, env=agent_env, template=template,
                          rank_logs=log_dir if uses_torchrun(env) else None,
                          on_rank_end=lambda pid: _stacks_of_a_hang(env, number, log_dir, pid, agent_env),
                          frozen_alone_s=alone_s, hang_s=hang_s, heartbeats=scratch / _BEATS,
                          on_hang=lambda pid, silence: _stacks_of_a_silent_script(env, number, log_dir, pid, hang_s,
                                                                                  silence, agent_env))
        except Exception as exc:  # noqa: BLE001 - every way the job cannot start must reach output/failure
            code = EXIT_CONTRACT_ERROR if isinstance(exc, ContractError) else 1
            return report(output_dir, code, f"{type(exc).__name__}: {exc}")
        returncode = child.wait()
        if returncode == 0:
            return report(output_dir, 0, "")
        if child.signals:
            return _stopped(env, child, returncode)
        failure = _diagnose(env, child, returncode, log_dir, faults.read_rank_failures(fault_dir))
        return failure, shown, scratch, time.monotonic() - started
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)  # the ranks' raw output: what they printed, unmasked


def _make_scratch(scratch: Path) -> None:
    """An attempt's private scratch in the host's tree (launcher.wire.opt_ml.SCRATCH_DIR; not TMPDIR,
    where a host killed by SIGKILL would leave it), with its ranks' log directory and their failure
    records' directory in it."""
    shutil.rmtree(scratch.parent / _FORKED, ignore_errors=True)  # the earlier attempt's ranks, all gone
    for directory in (scratch.parent, scratch, scratch / _RANKS, scratch / _FAULTS, scratch / _BEATS,
                      scratch.parent / _FORKED):
        private_dir(directory)


def frozen_alone_s(env: TrainingEnv) -> float:
    """How long a rank of a job with restarts may be stopped (SIGSTOP) before it is frozen, while no
    rank of its host has ended: its peers on other hosts fail at their step timeout and restart
    without it, so after the job's `step_timeout` (FROZEN_ALONE_S without one) it is ended and its
    host restarts with them."""
    value = env.hyperparameters.get("step_timeout")
    try:
        seconds = float(value) if value is not None and not isinstance(value, bool) else 0.0
    except (TypeError, ValueError):
        seconds = 0.0
    return seconds if seconds > 0 else FROZEN_ALONE_S


def _stacks_of_a_hang(env: TrainingEnv, number: int, log_dir: Path, torchrun_pid: int, agent_env: dict) -> None:
    """A rank of this host has ended while others live: where a step watchdog found a hang (its
    stacks are in this attempt's diagnostics), ask the live ranks for theirs before torchrun stops
    them. A rank whose own watchdog cannot run (a hang that holds the GIL) still answers SIGUSR1."""
    directory = attempt_dir(env.output_data_dir, number)
    if any(directory.glob("rank-*.txt")):
        collect_stacks(torchrun_pid, log_dir, directory, log, env.current_host,
                       reason="a step watchdog found a hang; asked before torchrun stops the ranks",
                       agent_env=agent_env)


def _stacks_of_a_silent_script(env: TrainingEnv, number: int, log_dir: Path, torchrun_pid: int,
                               hang_s: float, silence: Silence, agent_env: dict) -> None:
    """A script of the user's own has shown no CPU and no output (or, once it beats, no heartbeat) for its
    hang_timeout: every rank's stacks (SIGUSR1 where it catches it, py-spy where installed, its stderr's
    end) before it is stopped."""
    log(f"{env.current_host}: the script's ranks {silence.line} for {hang_s:.0f} s "
        f"(hang_timeout): collecting their stacks, then stopping them")
    collect_stacks(torchrun_pid, log_dir, attempt_dir(env.output_data_dir, number), log, env.current_host,
                   reason=f"{silence.reason} for {hang_s:.0f} s (hang_timeout)", agent_env=agent_env)


def _give_up(decision, number: int, policy: RestartPolicy, earlier: list[faults.Restart]) -> str:
    """What the failure report's first line adds: why this failure was not restarted, and every
    earlier failure of the job, so FailureReason has all of its reasons. Nothing for a job
    without restarts, whose report stays the toolkit's."""
    if not policy.restarts_anything:
        return ""
    if decision.failure_class == restart_policy.REQUESTED:
        why = f"not restarted: the job has run {number + 1} attempts, the most any job runs"
    elif decision.restart:
        why = f"not restarted: all {policy.max_restarts} restarts (max_restarts) used"
    else:
        why = f"not restarted ({decision.failure_class}: {decision.why})"
    return faults.gave_up(why, earlier[:-1])


def report(output_dir: Path, code: int, failure: str) -> int:
    """The job's outcome in `output/success` or `output/failure` (masked, cut to what SageMaker shows)."""
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

def launch_command(env: TrainingEnv, log_dir: Path, attempt: int = 0) -> list[str]:
    """torchrun where `uses_torchrun`, else `python <program> <args>` (run in code_dir). Attempt N
    (a restart) meets at the master port + N: a host still leaving the attempt before is never
    mistaken for one of this attempt's."""
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
    port += attempt if len(env.distribution_hosts) > 1 else 0  # one host: a free port each time
    hosts = env.distribution_hosts  # the toolkit's torchrun hosts: those of the distribution groups
    return [
        *_torchrun(env),
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


def _torchrun(env: TrainingEnv) -> list[str]:
    """torchrun, or for smlaunch's runtime torchrun's agent that imports it once and forks the
    ranks (container.distributed.forked_ranks; the arguments after this are the same)."""
    if not preloads_runtime(env):
        return [sys.executable, "-m", "torch.distributed.run"]
    return [sys.executable, "-u", "-m", "container.distributed.forked_ranks", "--start-method", "fork", "--run-path"]


def preloads_runtime(env: TrainingEnv) -> bool:
    """Ranks forked from a preloaded agent: under torchrun, for an entry point that is smlaunch's runtime."""
    return uses_torchrun(env) and bool(env.user_entry_point) and is_runtime(env.code_dir / env.user_entry_point)


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


def child_environment(env: TrainingEnv, attempt: int = 0, fault_dir: Path | None = None) -> dict[str, str]:
    """This process's environment plus the SM_* variables, PYTHONPATH, the NCCL/EFA settings and
    the attempt's (launcher.wire.faults: its number, where failing ranks leave their records)."""
    child = dict(os.environ)
    child.pop(TEMPLATE_ENV, None)  # the bootstrap's, not the script's
    child[faults.ATTEMPT_ENV] = str(attempt)
    child["SMLAUNCH_BOOTSTRAP_PID"] = str(os.getpid())  # the host a `host` fault injection ends
    if fault_dir is not None:
        child[faults.FAULT_DIR_ENV] = str(fault_dir)
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
    if preloads_runtime(env) and (env.code_dir / PACKAGES_DIR).is_dir():
        # the agent imports the runtime the job was submitted with, as entrypoints/train.py does
        paths.insert(0, str(env.code_dir / PACKAGES_DIR))
    child["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if uses_torchrun(env):  # over the job's own values, as the toolkit assigns them
        child.update(torchrun_variables(env.current_instance_type, env.network_interface_name))
        # the Flight Recorder dumps into this attempt's diagnostics (a variable the job set wins)
        child.update(flight_recorder_environment(attempt_dir(env.output_data_dir, attempt), child))
    return child


# --- running it ------------------------------------------------------------------------------

def _stopped(env: TrainingEnv, child: Child, returncode: int) -> int:
    """A stop (StopTrainingJob, a spot interruption, `smlaunch stop`) is no failure: the exit code
    says which signal, and no output/failure is written, so nothing reports the job as failed."""
    name = signal.Signals(child.signals[0]).name
    code = 128 + child.signals[0] if uses_torchrun(env) else exit_code(returncode)
    log(f"stopped (exit code {code}): received {name} and forwarded it to every rank")
    return code


def _diagnose(env: TrainingEnv, child: Child, returncode: int, log_dir: Path,
              records: dict[int, faults.RankFailure]) -> Failure:
    """The failure of a child that failed on its own, with the stderr its report quotes (`records`:
    the ranks' failure records, which say what a rank's exit code meant)."""
    tail = child.stderr_tail.decode("utf-8", "replace")
    if child.hung_after is not None:  # stopped by us (container.toolkit.script_watch): its exit says nothing
        return Failure(f"the script's ranks on host {env.current_host} {child.watch.silence.failure} for "
                       f"{child.hung_after:.0f} s (hang_timeout): hung", exit_code(returncode), hung=True,
                       stderr_tail=tail)
    if not uses_torchrun(env):
        return Failure(f"{env.user_entry_point} {process_ended(returncode)}", exit_code(returncode),
                       returncode < 0, stderr_tail=tail)
    causes = _ROOT_CAUSE.findall(tail)
    if not causes:  # no summary: torchrun itself failed (bad arguments, rendezvous timeout)
        return Failure(f"torchrun {process_ended(returncode)}", exit_code(returncode), returncode < 0,
                       stderr_tail=tail)
    rank, local_rank, exitcode = (int(x) for x in causes[-1])
    header = f"rank {rank} (host {env.current_host}, local rank {local_rank}) {rank_ended(exitcode, records.get(rank))}"
    frozen = bool(child.frozen and child.frozen.frozen)
    if frozen:  # they never answered: the collective that failed waited on them
        header = (f"{', '.join(child.frozen.frozen.values())} on host {env.current_host} did not report: stopped "
                  f"(SIGSTOP?) while its peers ran, so their collectives failed; first failure: {header}")
    return Failure(header, exit_code(exitcode), exitcode < 0, rank, frozen, rank_stderr(log_dir, local_rank))
