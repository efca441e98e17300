"""`smlaunch`: validate, plan, submit and follow training jobs, on SageMaker or locally.

Start-up stays light: `--help`, `validate`, `plan` and `schema` import neither boto3 nor torch,
and neither do `status`/`logs`/`stop` of a local job. Exit codes: 0 ok, 1 job failed (or AWS
refused, or `plan` predicts OOM), 2 invalid job file, usage or refused OOM, 130 interrupted.
"""

from __future__ import annotations

import json
import os
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

    # Tables written to a file or a pipe get room instead of an 80-column guess.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


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


def _backend_of(job_name: str, region: str | None):
    """The backend that has the job: the local job store's, else SageMaker's; an error naming
    both when neither has it. The name is checked first, so a bad one costs no AWS call."""
    from launcher.backends.base import BackendError, check_job_name
    from launcher.local import store

    check_job_name(job_name)
    if store.exists(job_name):
        return _local_backend()
    from botocore.exceptions import (  # only now: AWS is asked
        BotoCoreError,
        ClientError,
        NoCredentialsError,
    )

    not_local = f"no job named {job_name!r}: not a local job (in {store.jobs_root()})"
    try:
        backend = _backend(region)
        found = backend.exists(job_name)
    except ConfigError as exc:  # no region: SageMaker cannot be asked at all
        raise BackendError(f"{not_local}, and SageMaker cannot be asked: {exc.issues[0].problem} "
                           f"({exc.issues[0].fix})") from None
    except NoCredentialsError:
        raise BackendError(f"{not_local}, and SageMaker cannot be asked: no AWS credentials found "
                           "(aws configure, AWS_PROFILE, or an instance role)") from None
    except (BotoCoreError, ClientError) as exc:  # no network, access denied
        raise BackendError(f"{not_local}, and SageMaker could not be asked: {exc}") from None
    if not found:
        raise BackendError(f"{not_local}, nor a SageMaker training job in {backend.region}")
    return backend


def _local_backend(runner: str = "process"):
    from launcher.backends.local import LocalBackend

    return LocalBackend(runner=runner, printer=lambda line: click.echo(line))


def _load_local(job_file: Path, overrides: tuple[str, ...]):
    """`--local`: the job file's instance type becomes `local`, unless it already is local or local_gpu."""
    from launcher.jobfile import load_job_file

    data, _ = load_job_file(job_file, overrides)
    if data.get("instance_type") in ("local", "local_gpu"):
        return overrides
    return (*overrides, "instance_type=local")


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


def _image_text(job) -> tuple[str, str | None]:
    """The image and why it is the one (images.py decides both)."""
    cfg = job.config
    if cfg.is_local:
        if cfg.local_runner == "docker":
            from launcher.local.docker import DEFAULT_IMAGE

            return f"{cfg.image_uri or DEFAULT_IMAGE} (local docker runner)", None
        return "none: the local process runner uses this machine's Python", None
    if job.instance is None:
        return cfg.image_uri or "unknown (the instance type is not in the catalog)", None
    from launcher.backends.images import job_image_choice
    from launcher.config.job_rules import DEFAULT_REGION

    choice = job_image_choice(cfg, job.instance.name, cfg.region or DEFAULT_REGION, runtime=job.kind.runtime)
    region = cfg.region or f"{DEFAULT_REGION}; yours comes from the boto3 chain"
    return f"{choice.uri} (region {region})", choice.reason


def _summary(job) -> dict:
    cfg = job.config
    out = {
        "kind": str(job.kind),
        "instance_type": cfg.instance_type,
        "instances": cfg.instance_count,
        "processes_per_host": job.processes_per_host if job.processes_per_host else "detected at run time",
    }
    if job.instance and job.instance.accelerator:
        out["accelerator"] = f"{job.instance.accelerators} x {job.instance.accelerator.model}"
    out["image"], reason = _image_text(job)
    if reason:
        out["image_reason"] = reason
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
@click.option("--local", "local", is_flag=True,
              help="Run on this machine: instance_type becomes local (kept if local or local_gpu).")
@click.option("--force", is_flag=True, help="Submit even if the planner predicts it will not fit in memory.")
@click.option("--runner", type=click.Choice(["process", "docker"]), default=None,
              help="Local mode: simulated hosts as processes, or as containers (docker/podman compose); "
                   "default: the job's local_runner (process).")
def submit(job_file: Path, overrides: tuple[str, ...], dry_run: bool, no_wait: bool, job_name: str | None,
           local: bool, runner: str | None, force: bool) -> None:
    """Validate, pack and submit a job (or show the request with --dry-run).

    Local jobs (instance_type local or local_gpu, or --local) run here, as SageMaker would run
    them: one /opt/ml tree and one bootstrap per host, logs merged, artifacts in output_path.
    """
    from launcher.backends.base import check_job_name
    from launcher.jobfile import validate_job_file

    try:
        if job_name is not None:
            check_job_name(job_name, field="--job-name")
        if local:
            overrides = _load_local(job_file, overrides)
        job = validate_job_file(job_file, overrides)
    except ConfigError as exc:
        _report_invalid(exc)
        sys.exit(EXIT_INVALID)
    for issue in job.warnings:
        click.echo(click.style("warning ", fg="yellow") + str(issue), err=True)
    _check_memory(job, force=force, dry_run=dry_run)
    if job.config.is_local:
        _submit_local(job, job_name, runner or job.config.local_runner, dry_run=dry_run, no_wait=no_wait)
        return

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


def _check_memory(job, force: bool, dry_run: bool) -> None:
    """Refuse a job the planner predicts to run out of memory (exit 2), unless --force."""
    from launcher.plan import PredictedOOMError, check_fits

    try:
        check_fits(job)
    except PredictedOOMError as exc:
        if force or dry_run:
            note = " (--force given)" if force else ""
            click.echo(click.style("warning: ", fg="yellow", bold=True) + f"predicted out of memory{note}", err=True)
            click.echo(exc.explanation, err=True)
            return
        click.secho("refused: the job is predicted to run out of accelerator memory", fg="red", bold=True, err=True)
        click.echo(str(exc), err=True)
        sys.exit(EXIT_INVALID)


def _submit_local(job, job_name: str | None, runner: str, dry_run: bool, no_wait: bool) -> None:
    from launcher.backends.local import run_summary

    if dry_run:
        _fail("--dry-run shows a SageMaker request; a local job has none: run it, or drop --local", EXIT_INVALID)
    backend = _local_backend(runner)

    def run():
        name = backend.submit(job, job_name, detach=no_wait)
        directory = backend.describe(name)["LocalJobDir"]
        click.echo(f"submitted {name} (local, {runner} runner): {directory}")
        if no_wait:
            click.echo(f"  follow it: smlaunch logs {name} --follow\n  stop it:   smlaunch stop {name}")
            return
        try:
            record = backend.wait(name, logs=True)
        except KeyboardInterrupt:
            click.echo(f"\n{name} stopped; every host has ended. Logs: {directory}/logs/job.log", err=True)
            raise
        click.echo(click.style(f"{name} completed", fg="green", bold=True) + f" in {record.get('TrainingTimeInSeconds')} s")
        click.echo(f"  model artifact:  {record['ModelArtifacts']['S3ModelArtifacts']}")
        click.echo(f"  output artifact: {record['OutputArtifacts']['output.tar.gz']}")
        summary = run_summary(record)
        if summary:
            line = (f"  loss {summary['first_loss']:.4f} (step {summary['first_step']}) -> "
                    f"{summary['last_loss']:.4f} (step {summary['steps']})")
            if "last_val_loss" in summary:
                line += f", validation loss {summary['last_val_loss']:.4f}"
            if "tokens_per_s" in summary:
                line += f", {summary['tokens_per_s']:,.0f} tokens/s"
            click.echo(line)

    _aws_call(run)


@main.command()
@click.argument("job_name")
@region_option
@click.option("--json", "as_json", is_flag=True, help="Print DescribeTrainingJob as JSON.")
def status(job_name: str, region: str | None, as_json: bool) -> None:
    """Show a job's status, secondary status and failure reason."""

    def run():
        from launcher.masking import mask_secrets

        desc = mask_secrets(_backend_of(job_name, region).describe(job_name))  # a FailureReason may quote one
        if as_json:
            from launcher.backends.sagemaker import dumps

            click.echo(dumps(desc))
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
    _aws_call(lambda: _backend_of(job_name, region).logs(job_name, follow=follow, poll=poll))


@main.command()
@click.argument("job_name")
@region_option
def stop(job_name: str, region: str | None) -> None:
    """Stop a running job."""

    def run():
        _backend_of(job_name, region).stop(job_name)
        click.echo(f"stopping {job_name}")

    _aws_call(run)


@main.command(name="list")
@region_option
@click.option("--status", "status_filter", default=None,
              type=click.Choice(["InProgress", "Completed", "Failed", "Stopping", "Stopped"]),
              help="Only jobs with this status.")
@click.option("--name-contains", default=None, help="Only jobs whose name contains this text.")
@click.option("--max", "max_results", default=20, show_default=True, help="At most this many jobs.")
@click.option("--local", "local", is_flag=True, help="Local jobs (in $SMLAUNCH_HOME/jobs) instead of SageMaker's.")
def list_jobs(region: str | None, status_filter: str | None, name_contains: str | None, max_results: int,
              local: bool) -> None:
    """List recent training jobs."""

    def run():
        from rich.table import Table

        backend = _local_backend() if local else _backend(region)
        jobs = backend.list(status_filter, name_contains, max_results)
        table = Table()
        table.add_column("name", no_wrap=True)
        for column in ("status", "created", "ended"):
            table.add_column(column)
        for j in jobs:
            table.add_row(j["TrainingJobName"], j["TrainingJobStatus"], str(j.get("CreationTime", "")),
                          str(j.get("TrainingEndTime", "") or ""))
        _console().print(table)

    _aws_call(run)


@main.command(name="plan")
@job_file_arg
@set_option
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="Plan every value (combined with other --sweep options), e.g. context_parallel_degree=1,2,4,8.")
@click.option("--auto", "auto_pick", is_flag=True,
              help="Pick the cheapest configuration that fits (searches cp, hsd and checkpointing if nothing is swept).")
@click.option("--tokens", type=float, default=None, help="Also give hours and dollars for this many tokens (e.g. 1e9).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per configuration, in a list.")
def plan_cmd(job_file: Path, overrides: tuple[str, ...], sweeps: tuple[str, ...], auto_pick: bool,
             tokens: float | None, as_json: bool) -> None:
    """Predict memory per GPU, speed and cost before launch; explain a predicted OOM.

    Exit codes: 0 the (picked) configuration fits, 1 it does not (or none does), 2 invalid job
    (or one that cannot be planned: its model or world size is unknown).
    """
    from launcher import plan as planner

    try:
        if auto_pick:
            best, results = planner.auto_job_file(job_file, overrides, sweeps)
        elif sweeps:
            best, results = None, planner.sweep_job_file(job_file, overrides, sweeps)
        else:
            from launcher.jobfile import validate_job_file

            results = [planner.plan(validate_job_file(job_file, overrides))]
            best = None
    except ConfigError as exc:
        _report_invalid(exc)
        sys.exit(EXIT_INVALID)
    chosen = best if auto_pick else (results[0] if len(results) == 1 else None)
    if as_json:
        rows = []
        for r in results:
            row = r.to_dict()
            if auto_pick:
                row["picked"] = r is best
            if tokens and r.throughput:
                hours, usd = r.throughput.cost_for(tokens=tokens)
                row.update(hours_for_tokens=round(hours, 3), usd_for_tokens=None if usd is None else round(usd, 2))
            rows.append(row)
        click.echo(json.dumps(rows, indent=2, default=str))
    else:
        console = _console()
        console.print(planner.render_table(results, best=best, title=f"plan: {job_file}"))
        if chosen is not None and chosen.valid:
            if chosen.throughput:
                speed = chosen.throughput
                console.print(f"{speed.formula}: {speed.tflops_per_gpu:.0f} TFLOPS/GPU "
                              f"({speed.tflops_per_gpu_seed_formula:.0f} by the seed's formula), "
                              f"step {speed.step_s:.2f} s")
                if tokens:
                    hours, usd = speed.cost_for(tokens=tokens)
                    cost = f", ${usd:,.0f}" if usd is not None else ""
                    console.print(f"{tokens:,.0f} tokens: {hours:,.1f} h{cost}")
            if auto_pick:
                console.print(f"picked: {planner.describe(chosen)}  (--set " + " --set ".join(chosen.overrides) + ")"
                              if chosen.overrides else f"picked: {planner.describe(chosen)}")
            if chosen.oom or not auto_pick:
                console.print(planner.explain_oom(chosen.memory), highlight=False, markup=False)
        elif auto_pick:
            console.print("no configuration fits: see the table for the lowest peaks")
        elif len(results) == 1 and not results[0].valid:
            console.print("cannot plan: " + "; ".join(results[0].errors), markup=False)
    if chosen is None:
        sys.exit(EXIT_FAILED if auto_pick or not any(r.fits for r in results) else 0)
    if not chosen.valid:  # nothing to plan (the model or world size is unknown): the job needs a fix
        sys.exit(EXIT_INVALID)
    sys.exit(EXIT_FAILED if chosen.oom else 0)


@main.command()
def schema() -> None:
    """Print the JSON schema of job files."""
    from launcher.schema import job_file_schema

    click.echo(json.dumps(job_file_schema(), indent=2))


if __name__ == "__main__":
    main()
