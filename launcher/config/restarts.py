"""`max_restarts`: what it means where the job runs, and how it reaches the container (docs/faults.md).

The container's bootstrap restarts torchrun after a fault (launcher.wire.faults carries the
budget as SMLAUNCH_MAX_RESTARTS); the local and Slurm supervisors restart what the bootstrap
cannot, a host that is gone. On SageMaker, AWS's toolkit runs the bootstrap's restart loop in
place of torchrun (launcher.wire.restart_loop: the budget is a hyperparameter there). The
variables of launcher.wire.faults are smlaunch's to set: a job that sets them itself is refused,
and an armed fault injection is pointed out (it kills the job on purpose). smlaunch's control
variables in the caller's shell are pointed out too: no job gets them (launcher.wire.control_env).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from launcher.config import backend_table
from launcher.config.code_tree import ignored_by, job_ignore
from launcher.wire import control_env, faults, restart_loop, restart_policy
from launcher.wire.training.issues import Issue

SETUP = "setup.py"  # what makes AWS's toolkit take a code directory for a package
_OWN = (faults.MAX_RESTARTS_ENV, faults.ATTEMPT_ENV, faults.FAULT_DIR_ENV, restart_policy.EXIT_CODES_ENV,
        restart_policy.JOB_ERRORS_ENV, faults.HANG_TIMEOUT_ENV)
# Exit codes with a meaning of smlaunch's own, which no script's own rule may take
OWN_EXIT_CODES = {faults.EXIT_HUNG: "a hung step (the step watchdog's)",
                  faults.EXIT_NONFINITE_ROLLBACK: "a non-finite loss rolled back"}
SIGNALLED = 128  # a code of 128 + N is a process killed by signal N

# What the request then has that the SDK's has not (launcher.wire.restart_loop, docs/sagemaker-request.md).
REQUEST_NOTE = ("the request differs from the SageMaker SDK's in three hyperparameters only: sagemaker_program "
                "names _smlaunch/restart_loop.py, sagemaker_torch_distributed_enabled is left out, and "
                "sagemaker_smlaunch_restart_loop holds the budget and the two values they replace")


def restart_environment(job) -> dict[str, str]:
    """What the job's environment gains for its restart rules and its hang_timeout (nothing for the
    defaults: the request stays the SDK's)."""
    return job.restart_policy.environment()


def shell_issues(environ: Mapping[str, str]) -> list[Issue]:
    """A warning for each of smlaunch's control variables set in `environ` (the caller's shell)."""
    fixes = {faults.FAULT_ENV: "to arm fault injection for a test, set it in the job's environment",
             faults.MAX_RESTARTS_ENV: "set max_restarts in the job file"}
    return [Issue(f"${name}", environ[name], "is set in this shell, and smlaunch sets its control variables for "
                  "each job itself: the job does not get it", f"{fixes.get(name, 'unset it')} "
                  f"(docs/faults.md)", "warning") for name in control_env.in_shell(environ)]


def check_restarts(ctx) -> list[Issue]:
    job = ctx.job
    issues = shell_issues(os.environ)
    issues += [Issue(f"environment.{name}", job.environment[name], "is set by smlaunch for each attempt",
                     "remove it; set max_restarts for automatic restarts") for name in _OWN if name in job.environment]
    if faults.FAULT_ENV in job.environment:
        issues.append(Issue(f"environment.{faults.FAULT_ENV}", "(set)", "arms fault injection: the job's ranks "
                            "will be killed, hung or stopped on purpose (tests only)",
                            f"remove {faults.FAULT_ENV} for a real job", "warning"))
    issues += _rule_issues(ctx)
    if not job.restart_policy.needs_bootstrap:
        return issues
    if job.on_sagemaker:
        refused = _sagemaker_refusals(ctx)
        if refused:
            return issues + refused
    if job.max_restarts:
        issues.append(Issue("max_restarts", job.max_restarts, backend_table.named(job.backend_name).restarts,
                            level="info"))
    if job.on_sagemaker:
        issues.append(Issue(*_asking(job), REQUEST_NOTE, level="info"))
    if ctx.runtime and not job.hyperparameters.checkpoint_freq:
        issues.append(Issue("max_restarts", job.max_restarts, "each restart starts training again from step 1: "
                            "the job saves no checkpoints", "set hyperparameters.checkpoint_freq", "warning"))
    if not ctx.runtime:
        issues.append(Issue(*_asking(job), "a restart runs your script again from its start: "
                            "it resumes only from checkpoints it writes and reads itself (SM_CHECKPOINT_DIR or "
                            "checkpoint_local_path)", level="info"))
    return issues


def _asking(job) -> tuple[str, object]:
    """The field that asked for restarts, for the issues that any of them gets."""
    return ("max_restarts", job.max_restarts) if job.max_restarts else (
        "restart_on_exit_codes", list(job.restart_policy.exit_codes))


def _rule_issues(ctx) -> list[Issue]:
    """restart_on_exit_codes and restart_on_job_errors: refused where they cannot mean what they
    say, else shown with what they do."""
    job, issues = ctx.job, []
    codes = job.restart_policy.exit_codes
    if codes and ctx.runtime:
        issues.append(Issue("restart_on_exit_codes", list(codes), "is a rule for a script of your own: smlaunch's "
                            "train.py leaves with 1 on every error and is judged by its failure records",
                            "remove restart_on_exit_codes; use restart_on_job_errors to retry its errors"))
    for code in codes:
        if code in OWN_EXIT_CODES:
            issues.append(Issue("restart_on_exit_codes", code, f"is smlaunch's exit code for {OWN_EXIT_CODES[code]}, "
                                "which it restarts as a fault under max_restarts", "choose another code"))
        elif code >= SIGNALLED:
            issues.append(Issue("restart_on_exit_codes", code, f"is the code of a process killed by signal "
                                f"{code - SIGNALLED}, which is restarted as a fault under max_restarts",
                                "list the codes your script exits with itself (1-127)"))
    issues += _hang_issues(ctx)
    if job.restart_on_job_errors > job.max_restarts:
        issues.append(Issue("restart_on_job_errors", job.restart_on_job_errors, f"each retry is one of the "
                            f"max_restarts restarts, and max_restarts is {job.max_restarts}",
                            f"set max_restarts to {job.restart_on_job_errors} or more"))
    if codes and not any(i.level == "error" for i in issues):
        issues.append(Issue("restart_on_exit_codes", list(codes), f"a rank of your script that exits with one of "
                            f"them is restarted without counting against max_restarts (at most "
                            f"{faults.MAX_RESTARTS} restarts in all); in a job of several hosts each host "
                            "judges its own ranks' codes (docs/faults.md)", level="info"))
    if job.restart_on_job_errors and not any(i.level == "error" for i in issues):
        issues.append(Issue("restart_on_job_errors", job.restart_on_job_errors, "an error of the job's own code, "
                            "configuration or data is retried this many times, each one of the max_restarts "
                            "restarts", level="info"))
    return issues


def _hang_issues(ctx) -> list[Issue]:
    job = ctx.job
    if not job.hang_timeout:
        return []
    if ctx.runtime:
        return [Issue("hang_timeout", job.hang_timeout, "is for a script of your own: smlaunch's train.py has a "
                      "step watchdog in every rank", "remove hang_timeout; set hyperparameters.step_timeout")]
    dist = job.distribution
    if dist is None or not dist.torchrun:
        return [Issue("hang_timeout", job.hang_timeout, "watches the ranks torchrun starts, and the job does not "
                      "run under torchrun", "set distribution: {torch_distributed: {enabled: true}}, or remove "
                      "hang_timeout")]
    return [Issue("hang_timeout", job.hang_timeout, f"ranks that use no CPU and write nothing for "
                  f"{job.hang_timeout} s are hung: their stacks go to the output's diagnostics and the attempt "
                  "ends as a hang, restarted under max_restarts (docs/own-scripts.md)", level="info")]


def _sagemaker_refusals(ctx) -> list[Issue]:
    """What the restart loop cannot run on SageMaker: it takes the toolkit's place as the job's
    program and launches torchrun or python, so a ContainerEntrypoint (no toolkit) or an MPI or
    smdistributed-dataparallel launch (mpirun) leaves it nothing to do; and a code directory the
    toolkit takes for a package cannot run it (`_package_code`)."""
    job = ctx.job
    issues = _package_code(ctx)
    if job.container_entry_point is not None:
        issues.append(Issue(*_asking(job), "runs through the image's toolkit, which "
                            "container_entry_point replaces", f"remove container_entry_point or {_asking(job)[0]}"))
    dist = job.distribution
    for used, launch in ((dist is not None and dist.mpi_enabled, "distribution.mpi"),
                         (dist is not None and dist.dataparallel_enabled, "distribution.smdistributed.dataparallel")):
        if used:
            issues.append(Issue(*_asking(job), f"restarts torchrun, not the mpirun launch of "
                                f"{launch}", f"use distribution torch_distributed, or remove {_asking(job)[0]}"))
    return issues


def _package_code(ctx) -> list[Issue]:
    """AWS's toolkit (sagemaker_training: _entry_point_type.get, modules.install, process.ProcessRunner)
    takes a code directory that holds a setup.py for a Python package: it pip-installs the directory and
    runs the program as `python -m <program without .py>`, which for the loop's program, a path in
    `_smlaunch/`, is no module name. (Under torchrun the toolkit refuses such a directory outright.)"""
    job, code = ctx.job, ctx.code_dir
    if not job.source_dir or code is None or not (code / SETUP).is_file() or ignored_by(SETUP, job_ignore(job)):
        return []
    return [Issue(*_asking(job),
                  f"cannot run with source_dir {job.source_dir}, which holds a {SETUP}: AWS's toolkit installs "
                  f"such a code directory as a package and runs the program as a module, `python -m "
                  f"_smlaunch/{restart_loop.SCRIPT.removesuffix('.py')}`, which the restart loop's script is not",
                  f"move {SETUP} out of source_dir (a package of your own can ship in a subdirectory that "
                  f"requirements.txt installs: -e ./pkg), or remove {_asking(job)[0]}")]
