"""The commands that name a running or finished job: status, logs, stop, list (any backend)."""

from __future__ import annotations

import json
import re
import sys

import click

from launcher.cli.support import (
    EXIT_FAILED,
    EXIT_INVALID,
    JOB_HELP,
    BackendChoice,
    aws_call,
    echo,
    fail,
    find,
    make_console,
    region_option,
)
from launcher.config import backend_table

# Imports inside functions: each command imports what it uses when it runs (CLI start-up,
# bench/cli_startup.py).
from launcher.wire.terminal import printable


@click.command(epilog=JOB_HELP)
@click.argument("job")
@region_option
@click.option("--json", "as_json", is_flag=True,
              help="Print DescribeTrainingJob (a tuning job: DescribeHyperParameterTuningJob) as JSON.")
def status(job: str, region: str | None, as_json: bool) -> None:
    """Show a job's status, progress (step, loss, tokens/s, ETA), last checkpoint and failure reason;
    of a tuning job (`smlaunch tune`), its trials as a table and the best one.
    Exit code 1 when the job failed."""

    def run():
        from launcher.cli import jobview

        sweep = _sweep(job, region)
        if sweep is not None:
            return _sweep_status(sweep, as_json)
        backend, name = find(job, region)
        desc = jobview.describe(backend, name)
        if as_json:
            click.echo(json.dumps(desc, indent=2, default=str))
            return desc["TrainingJobStatus"]
        for line in jobview.status_lines(backend.name, name, desc):
            click.echo(line)
        return desc["TrainingJobStatus"]

    if aws_call(run) == "Failed":  # the exit codes of docs/cli: 1 for a job that failed
        sys.exit(EXIT_FAILED)


@click.command(epilog=JOB_HELP)
@click.argument("job")
@region_option
@click.option("--follow", "-f", is_flag=True, help="Keep following until the job ends.")
@click.option("--poll", default=5.0, show_default=True, help="Seconds between polls when following.")
@click.option("--diagnostics", is_flag=True,
              help="Print what a hang left instead: which rank hung and where, then every rank's stacks.")
def logs(job: str, region: str | None, follow: bool, poll: float, diagnostics: bool) -> None:
    """Print a job's logs from every host, merged (SageMaker: CloudWatch; local and Slurm: logs/job.log).
    Following on a terminal shows a progress bar below them."""
    if diagnostics and follow:
        fail("--diagnostics and --follow: choose one (diagnostics are written when a rank hangs)", EXIT_INVALID)

    def run():
        from launcher.backends.live import LiveProgress

        view = LiveProgress(plain=echo)
        backend, name = find(job, region, printer=view.line)
        if diagnostics:
            from launcher.cli import diagnostics_view

            diagnostics_view.show(name, backend, echo)
            return
        if not follow:
            backend.logs(name)
            return
        with view:
            backend.logs(name, follow=True, poll=poll)

    aws_call(run)


@click.command(epilog=JOB_HELP)
@click.argument("job")
@region_option
def stop(job: str, region: str | None) -> None:
    """Stop a running job: SIGTERM first, so the ranks save a checkpoint. A tuning job: its running
    trials are stopped so, and the sweep starts no more."""

    def run():
        sweep = _sweep(job, region)
        if sweep is not None:
            done = sweep.stop()
            click.echo(done or f"stopping tuning job {sweep.name}: its running trials are stopped and no more start")
            return
        backend, name = find(job, region)
        backend.stop(name)
        click.echo(f"stopping {name} ({backend.name})")

    aws_call(run)


@click.command(name="list")
@region_option
@click.option("--status", "status_filter", default=None,
              type=click.Choice(["InProgress", "Completed", "Failed", "Stopping", "Stopped"]),
              help="Only jobs with this status.")
@click.option("--name-contains", default=None, help="Only jobs whose name contains this text.")
@click.option("--max", "max_results", default=20, show_default=True, help="At most this many jobs.")
@click.option("--backend", "backends", multiple=True, type=BackendChoice(),
              help="Only this backend's jobs (repeatable; default: all of them).")
@click.option("--local", "local", is_flag=True, help="Only local jobs (as --backend local).")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.option("--tuning", is_flag=True, help="List the tuning jobs (`smlaunch tune`) instead, with their best trial "
                                           "(SageMaker's with --backend sagemaker).")
def list_jobs(region: str | None, status_filter: str | None, name_contains: str | None, max_results: int,
              backends: tuple[str, ...], local: bool, as_json: bool, tuning: bool) -> None:
    """List recent training jobs of every backend (local, Slurm, SageMaker), newest first."""
    if tuning:
        aws_call(lambda: _list_sweeps(status_filter, name_contains, max_results, as_json, backends, region))
        return

    def run():
        from launcher.backends import registry

        here = tuple(b.name for b in backend_table.BACKENDS if b.on_this_machine) if local else ()
        chosen = tuple(dict.fromkeys(backends + here)) or None  # None: every backend
        jobs, notes, unlisted = registry.list_all(chosen, region=region, status=status_filter,
                                                  name_contains=name_contains, max_results=max_results)
        if as_json:
            click.echo(json.dumps({"jobs": jobs, "notes": notes}, indent=2, default=str))
        else:
            from launcher.cli.jobview import jobs_table

            console = make_console()
            if jobs or len(unlisted) < len(chosen or backend_table.names()):  # no empty table: none was listed
                console.print(jobs_table(jobs, console.width))
            for note in notes:
                click.echo(note, err=True)
        # A backend that failed, or one asked for by name that is not set up: the listing is not
        # what was asked (exit 1). SageMaker unconfigured on a machine of local jobs is only noted.
        return any(failed or backends or local for failed in unlisted.values())

    if aws_call(run):
        sys.exit(EXIT_FAILED)


def _sweep(handle: str, region: str | None = None):
    """The tuning job a handle names: `sagemaker-tuning:NAME` on SageMaker, a bare name of a local or
    Slurm sweep (launcher.tune); None for job handles (backend:NAME) and names of no tuning job."""
    from launcher.tune import state
    from launcher.wire.training.issues import ConfigError, Issue

    if handle.startswith("sagemaker-tuning:"):  # launcher.backends.sagemaker_tuning.HANDLE_PREFIX
        from launcher.backends.sagemaker_tuning import SageMakerSweep
        from launcher.config.tuning import TUNING_JOB_NAME_PATTERN

        name = handle.partition(":")[2]
        if not re.fullmatch(TUNING_JOB_NAME_PATTERN, name):
            raise ConfigError([Issue("job", handle, "does not name a tuning job (1-32 of a-z, A-Z, 0-9 and -)",
                                     "give sagemaker-tuning:NAME with the tuning job's name")])
        return SageMakerSweep(name, region)

    try:
        if ":" in handle or not state.exists(handle):
            return None
    except ConfigError:  # not a valid name: the job commands say why
        return None
    from launcher.tune.sweep import SweepHandle  # the engine loads for a sweep only

    return SweepHandle(handle)


def _sweep_status(sweep, as_json: bool) -> str:
    from launcher.cli import tuneview

    desc = sweep.describe()
    if as_json:
        click.echo(json.dumps(desc, indent=2, default=str))
    else:
        tuneview.print_status(desc)
    return desc["HyperParameterTuningJobStatus"]


def _list_sweeps(status_filter: str | None, name_contains: str | None, max_results: int, as_json: bool,
                 backends: tuple[str, ...] = (), region: str | None = None) -> None:
    """smlaunch's sweeps (launcher.tune: local and Slurm), and, for a backend asked for by name whose jobs are
    SageMaker training jobs, SageMaker's tuning jobs."""
    from launcher.cli import tuneview

    found, damaged = [], []
    asked = [backend_table.named(name) for name in dict.fromkeys(backends)]
    if not asked or not all(row.sagemaker_jobs for row in asked):
        found, damaged = _smlaunch_sweeps(status_filter, name_contains)
    for row in asked:
        if row.sagemaker_jobs:
            from launcher.backends import registry
            from launcher.backends.sagemaker_tuning import SageMakerTuning, as_sweep_row

            api = SageMakerTuning(registry.backend_named(row.name, region=region))
            found += [as_sweep_row(s) for s in api.list(status_filter, name_contains, max_results)]
    found = found[:max_results]
    if as_json:
        click.echo(json.dumps({"tuning_jobs": found, "damaged": damaged}, indent=2, default=str))
    else:
        make_console().print(tuneview.sweeps_table(found))
    for why in damaged:
        click.echo(f"not listed: {printable(why)}", err=True)


def _smlaunch_sweeps(status_filter: str | None, name_contains: str | None) -> tuple[list[dict], list[str]]:
    """The descriptions of smlaunch's sweeps, and what was left out as damaged."""
    from launcher.tune import state
    from launcher.tune.sweep import SweepHandle

    found = []
    records, damaged = state.list_sweeps()
    for record in records:
        if name_contains and name_contains not in record["HyperParameterTuningJobName"]:
            continue
        try:
            found.append(SweepHandle(record["HyperParameterTuningJobName"]).describe())
        except state.DamagedSweep as exc:  # damaged since it was listed
            damaged.append(str(exc))
        except LookupError:  # deleted since it was listed
            continue
    return [d for d in found if not status_filter or d["HyperParameterTuningJobStatus"] == status_filter], damaged
