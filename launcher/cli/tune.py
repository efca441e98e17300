"""`smlaunch tune JOB_FILE`: a sweep of the job file's `tuning:` section, run here or on Slurm
(launcher.tune); `smlaunch status/stop/list --tuning` of a sweep are in launcher.cli.jobs and
print through launcher.cli.tuneview."""

from __future__ import annotations

import sys
from pathlib import Path

import click

# Imports inside functions: the sweep engine and the backends load when the command runs (CLI start-up).
from launcher.cli.support import (
    EXIT_FAILED,
    EXIT_INVALID,
    BackendChoice,
    aws_call,
    echo,
    fail,
    job_file_arg,
    local_overrides,
    report_invalid,
    set_option,
)
from launcher.config.issues import ConfigError


@click.command(name="tune")
@job_file_arg
@set_option
@click.option("--backend", "backend_name", type=BackendChoice(), default=None,
              help="Where the trials run (default: the job's backend).")
@click.option("--local", "local", is_flag=True, help="Run the trials on this machine (instance_type local).")
@click.option("--runner", type=click.Choice(["process", "docker"]), default=None,
              help="Local trials: hosts as processes, or as containers (default: the job's local_runner).")
@click.option("--name", default=None, help="The tuning job's name (default: <base_tuning_job_name>-<timestamp>).")
@click.option("--dry-run", is_flag=True,
              help="Print the trials' hyperparameters (Grid and Random know them up front) and start nothing.")
@click.option("--wait/--detach", default=True, show_default=True,
              help="--detach: a controller process runs the sweep; follow it with `smlaunch status NAME`.")
def tune(job_file: Path, overrides: tuple[str, ...], backend_name: str | None, local: bool, runner: str | None,
         name: str | None, dry_run: bool, wait: bool) -> None:
    """Run a hyperparameter sweep of a job file with a `tuning:` section (docs/tuning.md): every
    trial is an ordinary job (`smlaunch status/logs/metrics TRIAL`), `max_parallel_jobs` at a time.
    Exit code 1 when the sweep failed (every trial failed), 2 for an invalid job file."""
    from launcher.cli import tuneview
    from launcher.config.jobfile import validate_job_file

    try:
        if local:
            overrides = local_overrides(job_file, overrides)
        if backend_name:
            overrides = (*overrides, f"backend={backend_name}")
        if runner:
            overrides = (*overrides, f"local_runner={runner}")
        job = validate_job_file(job_file, overrides)
    except ConfigError as exc:
        report_invalid(exc)
        sys.exit(EXIT_INVALID)
    tuning = job.config.tuning
    if tuning is None:
        fail(f"{job_file} has no tuning: section, so there is nothing to sweep: add one (objective, ranges, "
             "strategy, max_jobs; docs/tuning.md), or run the job once with `smlaunch submit`", EXIT_INVALID)
    # ISSUE 41 §2 (the tuner's helper wires these here): the ranges checked at their extremes against the
    # job's rules (launcher.config.tuning_rules), and `--plan` printing launcher.plan.tuning's prediction.
    if job.config.backend_name == "sagemaker":
        fail("backend sagemaker: `smlaunch tune` does not create SageMaker tuning jobs yet; use the "
             "HyperparameterTuner, or --local / --backend slurm", EXIT_INVALID)
    for issue in job.warnings:
        click.echo(click.style("warning ", fg="yellow") + str(issue), err=True)

    def run():
        from launcher.tune.sweep import SweepHandle, check_sweep, start_sweep

        issues = check_sweep(tuning, job.config.backend_name, [d.name for d in job.config.metric_definitions or []])
        if issues:
            raise ConfigError(issues, str(job_file))
        if dry_run:
            tuneview.print_dry_run(job, tuning)
            return None
        handle = start_sweep(job.config, tuning, name=name, wait=wait, base_dir=job.base_dir, printer=echo)
        if not wait:
            click.echo(f"started tuning job {handle.name} (detached)\n  follow it: smlaunch status {handle.name}\n"
                       f"  stop it:   smlaunch stop {handle.name}")
            return None
        desc = SweepHandle(handle.name).describe()
        tuneview.print_status(desc)
        return desc["HyperParameterTuningJobStatus"]

    if aws_call(run) == "Failed":
        sys.exit(EXIT_FAILED)
