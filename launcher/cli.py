"""`smlaunch`: validate, submit and follow training jobs.

Start-up stays light: `--help`, `validate` and `schema` import neither boto3 nor torch.
Exit codes: 0 ok, 1 job failed (or AWS refused), 2 invalid job file or usage, 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from launcher.issues import ConfigError

EXIT_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 1, 2, 130

set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a job field, e.g. --set hyperparameters.fp8=0 or --set context_parallel_degree=8.",
)
region_option = click.option("--region", default=None, help="AWS region (default: the boto3 chain).")
job_file_arg = click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _report_invalid(exc: ConfigError) -> None:
    where = f" {exc.source}" if exc.source else ""
    click.secho(f"invalid job{where}: {len(exc.issues)} error(s)", fg="red", bold=True, err=True)
    for issue in exc.issues:
        click.echo(click.style("  error   ", fg="red") + str(issue), err=True)
    for issue in exc.warnings:
        click.echo(click.style("  warning ", fg="yellow") + str(issue), err=True)


def _fail(message: str, code: int) -> None:
    click.echo(click.style("error: ", fg="red", bold=True) + message, err=True)
    sys.exit(code)


def _aws_call(fn):
    """Run an AWS action, turning the usual failures into one clear line and an exit code."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    from launcher.backends.base import BackendError, JobFailedError
    from launcher.backends.images import ImageResolutionError
    from launcher.backends.sourcedir import SourceDirError

    try:
        return fn()
    except ConfigError as exc:
        _report_invalid(exc)
        sys.exit(EXIT_INVALID)
    except (SourceDirError, ImageResolutionError) as exc:
        _fail(str(exc), EXIT_INVALID)
    except JobFailedError as exc:
        _fail(str(exc), EXIT_FAILED)
    except NoCredentialsError:
        _fail("no AWS credentials found: configure them (aws configure, AWS_PROFILE, or an instance "
              "role), or use --dry-run to see the request without sending it", EXIT_FAILED)
    except (ClientError, BotoCoreError, BackendError) as exc:
        _fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


def _backend(region: str | None):
    from launcher.backends.sagemaker import SageMakerBackend

    return SageMakerBackend(region=region, printer=lambda line: click.echo(line))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="smlaunch")
def main() -> None:
    """Validate and launch SageMaker-style distributed training jobs."""


@main.command()
@job_file_arg
@set_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def validate(job_file: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """Check a job file against its instance type; print every error at once."""
    from launcher.jobfile import validate_job_file

    try:
        job = validate_job_file(job_file, overrides)
    except ConfigError as exc:
        if as_json:
            click.echo(json.dumps({"valid": False, "errors": [i.to_dict() for i in exc.issues],
                                   "warnings": [i.to_dict() for i in exc.warnings]}, indent=2, default=str))
        else:
            _report_invalid(exc)
        sys.exit(EXIT_INVALID)
    summary = _summary(job)
    if as_json:
        click.echo(json.dumps({"valid": True, "errors": [], "summary": summary,
                               "warnings": [i.to_dict() for i in job.warnings]}, indent=2, default=str))
        return
    click.echo(click.style("valid ", fg="green") + str(job_file))
    for key, value in summary.items():
        click.echo(f"  {key:<20} {value}")
    for issue in job.warnings:
        click.echo(click.style("  warning ", fg="yellow") + str(issue))


def _summary(job) -> dict:
    cfg = job.config
    out = {
        "instance_type": cfg.instance_type,
        "instances": cfg.instance_count,
        "processes_per_host": job.processes_per_host if job.processes_per_host else "detected at run time",
    }
    if job.instance and job.instance.accelerator:
        out["accelerator"] = f"{job.instance.accelerators} x {job.instance.accelerator.model}"
    if job.layout:
        lay = job.layout
        out["world_size"] = lay.world
        out["mesh"] = ", ".join(f"{n}={s}" for n, s in zip(lay.mesh_dim_names, lay.mesh_shape))
        out["sharding_group"] = lay.sharding_group
        out["data_parallel"] = lay.data_parallel
    if job.model:
        out["model"] = job.model.name
    if cfg.hyperparameters.max_context_width:
        out["sequence_length"] = cfg.hyperparameters.max_context_width
    precision = "fp8" if job.fp8.enabled else ("bf16" if cfg.hyperparameters.bf16 else "default")
    out["precision"] = precision + (f" ({job.fp8.backend}, {job.fp8.recipe} scaling)" if job.fp8.enabled else "")
    return out


@main.command()
@job_file_arg
@set_option
@click.option("--dry-run", is_flag=True, help="Print the CreateTrainingJob request as JSON; send nothing.")
@click.option("--no-wait", is_flag=True, help="Return once the job is created.")
@click.option("--job-name", default=None, help="Exact job name (default: <base_job_name>-<timestamp>).")
def submit(job_file: Path, overrides: tuple[str, ...], dry_run: bool, no_wait: bool, job_name: str | None) -> None:
    """Validate, pack and submit a job (or show the request with --dry-run)."""
    from launcher.jobfile import validate_job_file

    try:
        job = validate_job_file(job_file, overrides)
    except ConfigError as exc:
        _report_invalid(exc)
        sys.exit(EXIT_INVALID)
    for issue in job.warnings:
        click.echo(click.style("warning ", fg="yellow") + str(issue), err=True)
    if job.config.is_local:
        _fail(f"instance_type {job.config.instance_type!r}: local mode is not available in this version; "
              "use an ml.* instance type", EXIT_INVALID)

    def run():
        backend = _backend(job.config.region)
        if dry_run:
            from launcher.backends.sagemaker import dumps

            click.echo(dumps(backend.dryrun(job, job_name).to_dict()))
            return
        name = backend.submit(job, job_name)
        click.echo(f"submitted {name}")
        if not no_wait:
            backend.wait(name, logs=True)
            click.echo(f"{name} completed")

    _aws_call(run)


@main.command()
@click.argument("job_name")
@region_option
@click.option("--json", "as_json", is_flag=True, help="Print DescribeTrainingJob as JSON.")
def status(job_name: str, region: str | None, as_json: bool) -> None:
    """Show a job's status, secondary status and failure reason."""

    def run():
        desc = _backend(region).describe(job_name)
        if as_json:
            from launcher.backends.sagemaker import dumps
            from launcher.masking import mask_secrets

            click.echo(dumps(mask_secrets(desc)))
            return
        click.echo(f"{job_name}: {desc['TrainingJobStatus']} ({desc.get('SecondaryStatus', '')})")
        if desc.get("FailureReason"):
            click.echo(f"failure reason: {desc['FailureReason']}")
        artifacts = desc.get("ModelArtifacts", {}).get("S3ModelArtifacts")
        if artifacts:
            click.echo(f"model artifacts: {artifacts}")

    _aws_call(run)


@main.command()
@click.argument("job_name")
@region_option
@click.option("--follow", "-f", is_flag=True, help="Keep following until the job ends.")
@click.option("--poll", default=5.0, show_default=True, help="Seconds between polls when following.")
def logs(job_name: str, region: str | None, follow: bool, poll: float) -> None:
    """Print a job's CloudWatch logs from every host, merged by time."""
    _aws_call(lambda: _backend(region).logs(job_name, follow=follow, poll=poll))


@main.command()
@click.argument("job_name")
@region_option
def stop(job_name: str, region: str | None) -> None:
    """Stop a running job."""

    def run():
        _backend(region).stop(job_name)
        click.echo(f"stopping {job_name}")

    _aws_call(run)


@main.command(name="list")
@region_option
@click.option("--status", "status_filter", default=None,
              type=click.Choice(["InProgress", "Completed", "Failed", "Stopping", "Stopped"]),
              help="Only jobs with this status.")
@click.option("--name-contains", default=None, help="Only jobs whose name contains this text.")
@click.option("--max", "max_results", default=20, show_default=True, help="At most this many jobs.")
def list_jobs(region: str | None, status_filter: str | None, name_contains: str | None, max_results: int) -> None:
    """List recent training jobs."""

    def run():
        from rich.table import Table

        jobs = _backend(region).list(status_filter, name_contains, max_results)
        table = Table("name", "status", "created", "ended")
        for j in jobs:
            table.add_row(j["TrainingJobName"], j["TrainingJobStatus"], str(j.get("CreationTime", "")),
                          str(j.get("TrainingEndTime", "") or ""))
        _console().print(table)

    _aws_call(run)


@main.command()
def schema() -> None:
    """Print the JSON schema of job files."""
    from launcher.schema import job_file_schema

    click.echo(json.dumps(job_file_schema(), indent=2))


if __name__ == "__main__":
    main()
