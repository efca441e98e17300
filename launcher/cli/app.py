"""`smlaunch`: validate, plan, submit and follow training jobs, on SageMaker or locally.

This module holds the group and the commands that take a job file (validate, submit, schema);
the job commands are launcher.cli.jobs, `plan` launcher.cli.plan, `metrics` launcher.cli.metrics,
`tune` launcher.cli.tune, `warm-pool` launcher.cli.warm_pool.

Start-up stays light: `--help`, `validate`, `plan` and `schema` import neither boto3 nor torch,
and neither do `status`/`logs`/`stop` of a local job. Exit codes: 0 ok, 1 job failed (or AWS
refused, or `plan` predicts OOM), 2 invalid job file, usage or refused OOM, 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

# Imports inside functions: each command imports what it uses when it runs, so `smlaunch --help` and
# `validate` start without boto3, torch or the backends, and the commands of the other modules
# (jobs, plan, metrics) load only when named or listed (bench/cli_startup.py).
from launcher.cli.support import (
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
from launcher.config import backend_table
from launcher.wire.training import data_order
from launcher.wire.training.issues import ConfigError
from launcher.wire.training.lora import describe as describe_lora
from launcher.wire.training.lora import lora_settings
from launcher.wire.training.models import describe_attention_kernel

# The commands defined in the other modules of launcher.cli, by name.
ELSEWHERE = ("list", "logs", "metrics", "plan", "status", "stop", "tune", "warm-pool")


def _command_elsewhere(name: str) -> click.Command:
    if name == "plan":
        from launcher.cli.plan import plan_cmd

        return plan_cmd
    if name == "metrics":
        from launcher.cli.metrics import metrics

        return metrics
    if name == "warm-pool":
        from launcher.cli.warm_pool import warm_pool

        return warm_pool
    if name == "tune":
        from launcher.cli.tune import tune

        return tune
    from launcher.cli import jobs

    return {"list": jobs.list_jobs, "logs": jobs.logs, "status": jobs.status, "stop": jobs.stop}[name]


class _Group(click.Group):
    """The `smlaunch` group: the commands of jobs.py, plan.py and metrics.py are imported when the
    command line names one or `--help` lists them, not to validate a job file."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *ELSEWHERE})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in ELSEWHERE and cmd_name not in self.commands:
            self.add_command(_command_elsewhere(cmd_name), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="smlaunch")
def main() -> None:
    """Validate and launch SageMaker-style distributed training jobs."""


@main.command()
@job_file_arg
@set_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--verbose", "-v", is_flag=True, help="Print the details behind the one-line notes and warnings.")
def validate(job_file: Path, overrides: tuple[str, ...], as_json: bool, verbose: bool) -> None:
    """Check a job file against its instance type; print every error at once."""
    from launcher.config.jobfile import validate_job_file

    try:
        job = validate_job_file(job_file, overrides)
    except ConfigError as exc:
        if as_json:
            click.echo(json.dumps({"valid": False, "errors": [i.to_dict() for i in exc.issues],
                                   "warnings": [i.to_dict() for i in exc.warnings]}, indent=2, default=str))
        else:
            report_invalid(exc)
        sys.exit(EXIT_INVALID)
    summary = _summary(job)
    if as_json:
        click.echo(json.dumps({"valid": True, "errors": [], "summary": summary,
                               "warnings": [i.to_dict() for i in job.warnings],
                               "notes": [i.to_dict() for i in job.notes]}, indent=2, default=str))
        return
    click.echo(click.style("valid ", fg="green") + str(job_file))
    for key, value in summary.items():
        click.echo(f"  {key:<20} {value}")
    for issue in job.warnings:
        click.echo(click.style("  warning ", fg="yellow") + str(issue))
        if verbose and issue.detail:
            click.echo(f"          {issue.detail}")
    for issue in job.notes:
        click.echo(click.style("  note    ", fg="cyan") + str(issue))
        if verbose and issue.detail:
            click.echo(f"          {issue.detail}")


def _image_text(job) -> tuple[str, str | None]:
    """The image and why it is the one (images.py decides both; a backend whose hosts run another says it)."""
    cfg = job.config
    row = backend_table.named(cfg.backend_name)
    if row.image is not None:
        return backend_table.load(row.image)(job), None
    if job.instance is None:
        return cfg.image_uri or "unknown (the instance type is not in the catalog)", None
    from launcher.config.images import job_image_choice
    from launcher.config.job_rules import DEFAULT_REGION

    choice = job_image_choice(cfg, job.instance.name, cfg.region or DEFAULT_REGION, runtime=job.kind.runtime)
    region = cfg.region or f"{DEFAULT_REGION}; yours comes from the boto3 chain"
    return f"{choice.uri} (region {region})", choice.reason


def _torch_text(job) -> str:
    """Which torch the job really gets (script_rules decides)."""
    from launcher.config.job_rules import DEFAULT_REGION
    from launcher.config.script_rules import job_torch, target_of

    cfg = job.config
    target = target_of(cfg, job.instance.name if job.instance else None, cfg.region or DEFAULT_REGION)
    image_torch = None
    if target.kind in ("smp", "dlc") and job.instance is not None:
        from launcher.config.images import ImageResolutionError, job_image_choice

        try:
            image_torch = job_image_choice(cfg, job.instance.name, cfg.region or DEFAULT_REGION,
                                           runtime=job.kind.runtime).torch
        except ImageResolutionError:
            image_torch = None
    return job_torch(cfg, target, image_torch)


def _summary(job) -> dict:
    cfg = job.config
    out = {
        "kind": str(job.kind),
        "backend": cfg.backend_name,
        "instance_type": cfg.instance_type,
        "instances": cfg.instance_count,
        "processes_per_host": job.processes_per_host if job.processes_per_host else "detected at run time",
    }
    if job.instance and job.instance.accelerator:
        out["accelerator"] = f"{job.instance.accelerators} x {job.instance.accelerator.model}"
    out["image"], reason = _image_text(job)
    if reason:
        out["image_reason"] = reason
    out["torch"] = _torch_text(job)
    if job.layout:
        lay = job.layout
        out["world_size"] = lay.world
    if job.layout and (job.kind.runtime or job.smp_script):  # the mesh smlaunch's runtime (or SMP) builds
        out["mesh"] = ", ".join(f"{n}={s}" for n, s in zip(lay.mesh_dim_names, lay.mesh_shape))
        out["sharding_group"] = lay.sharding_group
        out["data_parallel"] = lay.data_parallel
        if lay.pp > 1:
            p = cfg.distribution.parameters
            out["pipeline"] = (f"{lay.pp * p.pipeline_virtual_stages} stages ({p.pipeline_virtual_stages} per rank), "
                               f"{p.schedule} schedule, {p.microbatches} microbatches")
    if job.model:
        out["model"] = job.model.name
        if job.kind.runtime and (adapters := lora_settings(cfg.hyperparameters, job.model)):
            out["adapters"] = describe_lora(job.model, adapters)
    if cfg.tuning is not None:  # every trial passed the job's rules (launcher.config.tuning_rules)
        out["sweep"] = cfg.tuning.summary()
    settings = job.settings if job.kind.runtime else None  # what smlaunch's runtime will run, defaults included
    if settings:
        out["sequence_length"] = settings.seq_len
        out["batch"] = f"{settings.micro_batch} sequence(s) per data-parallel rank x {settings.grad_accum} step(s)"
        out["activation_checkpointing"] = (settings.ac_mode or "off") + (" + offload" if settings.offload else "")
        out["compile"] = "on: torch.compile of each transformer block and the loss" if settings.compile else "off"
        out["data"] = data_order.describe(settings.dataset_type, settings.shuffle, settings.seed,
                                          settings.data_mixture, settings.truncation_mode)
        out["document_masking"] = (f"on where the data marks documents (position_ids restarting at 0, "
                                   f"indexed shards, chat examples); "
                                   f"{describe_attention_kernel(settings.attention_kernel)}"
                                   if settings.document_masking else "off: packed documents see each other")
    elif cfg.hyperparameters.max_context_width:
        out["sequence_length"] = cfg.hyperparameters.max_context_width
    bf16 = settings.bf16 if settings else bool(cfg.hyperparameters.bf16)
    precision = "fp8" if job.fp8.enabled else ("bf16" if bf16 else "default")
    out["precision"] = precision + (f" ({job.fp8.backend}, {job.fp8.recipe} scaling)" if job.fp8.enabled else "")
    return out


@main.command()
@job_file_arg
@set_option
@click.option("--dry-run", is_flag=True,
              help="Print what would be submitted (SageMaker: the CreateTrainingJob request; Slurm: the batch "
                   "script; local: the job's hosts and settings); send, upload and write nothing.")
@click.option("--no-wait", is_flag=True, help="Return once the job is submitted.")
@click.option("--job-name", default=None, help="Exact job name (default: <base_job_name>-<timestamp>).")
@click.option("--backend", "backend_name", type=BackendChoice(), default=None,
              help="Where the job runs (default: the job's backend; local for instance_type local/local_gpu, "
                   "else sagemaker).")
@click.option("--local", "local", is_flag=True,
              help="Run on this machine: instance_type becomes local (kept if local or local_gpu).")
@click.option("--force", is_flag=True, help="Submit even if the planner predicts it will not fit in memory.")
@click.option("--trace", "trace", is_flag=True,
              help="First trace one step of the runtime at the job's whole world (as `plan --trace`, the job "
                   "file's trace: true) and refuse the job if the trace fails or its peak does not fit.")
@click.option("--runner", type=click.Choice(["process", "docker"]), default=None,
              help="Local mode: simulated hosts as processes, or as containers (docker/podman compose); "
                   "default: the job's local_runner (process).")
def submit(job_file: Path, overrides: tuple[str, ...], dry_run: bool, no_wait: bool, job_name: str | None,
           backend_name: str | None, local: bool, runner: str | None, force: bool, trace: bool) -> None:
    """Validate, pack and submit a job (or show what would be submitted with --dry-run).

    Local jobs (instance_type local or local_gpu, or --local) run here, as SageMaker would run
    them: one /opt/ml tree and one bootstrap per host, logs merged, artifacts in output_path.
    Slurm jobs (backend: slurm) run the same way on the allocation's nodes.
    """
    from launcher.backends import registry
    from launcher.config.job_names import check_job_name
    from launcher.config.jobfile import validate_job_file

    try:
        if job_name is not None:
            check_job_name(job_name, field="--job-name")
        if local:
            overrides = local_overrides(job_file, overrides)
        if backend_name:
            overrides = (*overrides, f"backend={backend_name}")
        job = validate_job_file(job_file, overrides)
    except ConfigError as exc:
        report_invalid(exc)
        sys.exit(EXIT_INVALID)
    if job.config.tuning is not None:  # a sweep is many jobs: never one of them silently
        fail(f"{job_file} has a tuning: section, which describes a sweep of this job: run it with "
             f"`smlaunch tune {job_file}`, or remove the section to submit the job once", EXIT_INVALID)
    for issue in job.warnings:
        click.echo(click.style("warning ", fg="yellow") + str(issue), err=True)
    for issue in job.notes:
        click.echo(click.style("note ", fg="cyan") + str(issue), err=True)
    _check_memory(job, force=force, dry_run=dry_run)
    if trace or job.config.trace:
        _check_trace(job)

    def run():
        from launcher.backends.live import LiveProgress

        view = LiveProgress(plain=echo)  # the log lines, and a progress bar on a terminal
        # this process runs nothing but the job: a job run in it may adopt the job's orphans
        backend = registry.for_job(job, runner=runner, printer=view.line, console=view.host_line, adopt_orphans=True)
        if dry_run:
            result = backend.dryrun(job, job_name)
            click.echo(result.render())
            if getattr(result, "bundle", None) is not None:  # on stderr: stdout stays the request alone
                click.echo(result.bundle.summary(), err=True)
            return
        name = backend.submit(job, job_name, detach=no_wait)
        record = backend.describe(name)
        directory = backend.job_dir(name)
        where = f": {directory}" if directory else ""
        click.echo(f"submitted {name} ({backend.how(record)}){where}")
        if no_wait:
            click.echo(f"  follow it: smlaunch logs {backend.name}:{name} --follow\n"
                       f"  stop it:   smlaunch stop {backend.name}:{name}")
            return
        try:
            with view:
                record = backend.wait(name, logs=True)
        except KeyboardInterrupt:
            said = backend.interrupted(name)
            if said:
                click.echo(f"\n{said}", err=True)
            raise
        _report_completed(backend, name, record)

    aws_call(run)


def _report_completed(backend, name: str, record: dict) -> None:
    from launcher.backends.jobdir import run_summary

    took = f" in {record['TrainingTimeInSeconds']} s" if record.get("TrainingTimeInSeconds") is not None else ""
    click.echo(click.style(f"{name} completed", fg="green", bold=True) + took)
    artifacts = backend.artifacts(name)
    for label, key in (("model artifact: ", "model.tar.gz"), ("output artifact:", "output.tar.gz")):
        if key in artifacts:
            click.echo(f"  {label} {artifacts[key]}")
    for key, where in artifacts.items():  # what a backend keeps unpacked (a Kubernetes claim's directories)
        if key not in ("model.tar.gz", "output.tar.gz"):
            click.echo(f"  {key}: {where}")
    if not {"model.tar.gz", "model"} & set(artifacts):
        click.echo("  model artifact:  none (the job left its model directory empty)")
    summary = run_summary(record) if backend.job_dir(name) else {}
    if summary:
        line = (f"  loss {summary['first_loss']:.4f} (step {summary['first_step']}) -> "
                f"{summary['last_loss']:.4f} (step {summary['steps']})")
        if "last_val_loss" in summary:
            line += f", validation loss {summary['last_val_loss']:.4f}"
        if "tokens_per_s" in summary:
            line += f", {summary['tokens_per_s']:,.0f} tokens/s"
        click.echo(line)
    restarted = [r for r in backend.restarts(name) if r.restarted]
    if restarted:
        click.echo(f"  restarts: {len(restarted)} (`smlaunch status {name}` lists them)")
    measured = backend.goodput(name)
    if measured is not None:  # productive training time / wall time, and where the rest went
        click.echo(f"  {measured.text()}")


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


def _check_trace(job) -> None:
    """Refuse the job (exit 2, nothing submitted) when its trace fails or its traced peak does not fit."""
    from launcher.plan import TraceRefusal, check_trace

    try:
        check_trace(job)
    except TraceRefusal as exc:
        click.secho("refused: " + str(exc), fg="red", bold=True, err=True)
        sys.exit(EXIT_INVALID)
    click.echo("trace: every traced rank's step fits", err=True)


@main.command()
def schema() -> None:
    """Print the JSON schema of job files."""
    from launcher.config.schema import job_file_schema

    click.echo(json.dumps(job_file_schema(), indent=2))
