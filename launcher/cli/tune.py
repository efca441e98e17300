"""`smlaunch tune JOB_FILE`: a sweep of the job file's `tuning:` section, run here or on Slurm
(launcher.tune); `smlaunch status/stop/list --tuning` of a sweep are in launcher.cli.jobs and
print through launcher.cli.tuneview."""

from __future__ import annotations

import json
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
from launcher.wire.training.issues import ConfigError


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
@click.option("--plan", "plan_only", is_flag=True,
              help="Print the sweep's predicted cost, time and memory (its trials planned at their ranges' extremes) "
                   "and start nothing.")
@click.option("--force", is_flag=True, help="Start even if the planner predicts a trial will not fit in memory.")
@click.option("--wait/--detach", default=True, show_default=True,
              help="--detach: a controller process runs the sweep; follow it with `smlaunch status NAME`.")
def tune(job_file: Path, overrides: tuple[str, ...], backend_name: str | None, local: bool, runner: str | None,
         name: str | None, dry_run: bool, plan_only: bool, force: bool, wait: bool) -> None:
    """Run a hyperparameter sweep of a job file with a `tuning:` section (docs/tuning.md): every
    trial is an ordinary job (`smlaunch status/logs/metrics TRIAL`), `max_parallel_jobs` at a time.
    Backend sagemaker: a SageMaker tuning job, as the HyperparameterTuner creates one.
    Exit code 1 when the sweep failed (every trial failed), 2 for an invalid job file or a sweep
    whose trial is predicted not to fit in memory (--force starts it anyway)."""
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
    # validate_job_file has checked every trial (launcher.config.tuning_rules): the ranges at their
    # extremes and each categorical value against the job's own rules, and the objective.
    if plan_only:
        from launcher.plan.tuning import sweep_report

        click.echo(sweep_report(job))
        return
    _check_memory(job, force=force, dry_run=dry_run)
    for issue in job.warnings:
        click.echo(click.style("warning ", fg="yellow") + str(issue), err=True)

    def run():
        from launcher.tune.sweep import SweepHandle, check_sweep, start_sweep

        if job.config.on_sagemaker:
            return _on_sagemaker(job, name, dry_run, wait)
        issues = check_sweep(tuning, job.config.backend_name)
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


def _check_memory(job, force: bool, dry_run: bool) -> None:
    """Refuse a sweep with a trial the planner predicts to run out of memory (exit 2), unless --force."""
    from launcher.plan import PredictedOOMError
    from launcher.plan.tuning import check_sweep_fits

    try:
        check_sweep_fits(job, job.config.tuning)
    except PredictedOOMError as exc:
        if force or dry_run:
            click.echo(click.style("warning: ", fg="yellow", bold=True) + str(exc), err=True)
            return
        click.secho("refused: a trial of the sweep is predicted to run out of accelerator memory", fg="red",
                    bold=True, err=True)
        click.echo(f"{exc}\n(narrow the range, or --force to start it anyway)", err=True)
        sys.exit(EXIT_INVALID)


def _on_sagemaker(job, name: str | None, dry_run: bool, wait: bool) -> str | None:
    """A SageMaker tuning job, created as the HyperparameterTuner creates one (its request is cut from
    the training job's own: launcher.backends.tuning_request)."""
    from launcher.backends import registry
    from launcher.backends.sagemaker_tuning import SageMakerTuning

    api = SageMakerTuning(registry.backend_named(job.config.backend_name, region=job.config.region))
    if dry_run:
        click.echo(json.dumps(api.dryrun(job, job.config.tuning, name), indent=2, default=str))
        return None
    created = api.create(job, job.config.tuning, name)
    click.echo(f"created SageMaker tuning job {created} in {api.backend.region}")
    if not wait:
        click.echo(f"  follow it: smlaunch status sagemaker-tuning:{created}\n"
                   f"  stop it:   smlaunch stop sagemaker-tuning:{created}")
        return None
    desc = api.wait(created)
    best = (desc.get("BestTrainingJob") or {})
    metric = best.get("FinalHyperParameterTuningJobObjectiveMetric") or {}
    found = f"; best {best['TrainingJobName']}, {metric.get('MetricName')} {metric.get('Value')}" if best else ""
    click.echo(f"tuning job {created}: {desc['HyperParameterTuningJobStatus']}{found}")
    return "Failed" if desc["HyperParameterTuningJobStatus"] == "Failed" else None
