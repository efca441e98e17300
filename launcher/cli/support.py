"""What every `smlaunch` command shares: exit codes, common options, the console, and how an
error reaches the user (one line or a list of issues, and an exit code; never a traceback)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

# Imports inside functions: botocore and the backends' errors load only when a command reports an
# error (CLI start-up).
from launcher.config import backend_table
from launcher.wire.terminal import printable
from launcher.wire.training.issues import ConfigError

EXIT_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 1, 2, 130

set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a job field, e.g. --set hyperparameters.fp8=0 or --set context_parallel_degree=8.",
)
region_option = click.option("--region", default=None, help="AWS region (default: the boto3 chain).")
job_file_arg = click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))


class BackendChoice(click.Choice):
    """One of the backend table's names (launcher.config.backend_table), read when the option is
    parsed or shown, not when the command is defined: the table is the choices' one source."""

    def __init__(self) -> None:  # click.Choice's would store a copy of the choices
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:
        return backend_table.names()


def local_overrides(job_file: Path, overrides: tuple[str, ...]) -> tuple[str, ...]:
    """`--local`: the job file's instance type becomes `local`, unless it already is local or local_gpu."""
    from launcher.config.jobfile import load_job_file
    from launcher.wire.training.catalog import LOCAL_TYPES

    data, _ = load_job_file(job_file, overrides)
    if data.get("instance_type") in LOCAL_TYPES:
        return overrides
    return (*overrides, "instance_type=local")


def make_console(stderr: bool = False):
    from rich.console import Console

    # Tables written to a file or a pipe get room instead of an 80-column guess.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def report_invalid(exc: ConfigError) -> None:
    where = f" {exc.source}" if exc.source else ""
    click.secho(f"invalid job{where}: {len(exc.issues)} error(s)", fg="red", bold=True, err=True)
    for issue in exc.issues:
        click.echo(click.style("  error   ", fg="red") + str(issue), err=True)
    for issue in exc.warnings:
        click.echo(click.style("  warning ", fg="yellow") + str(issue), err=True)


def fail(message: str, code: int) -> None:
    # The message may carry a job's FailureReason: no terminal control but colour.
    click.echo(click.style("error: ", fg="red", bold=True) + printable(message), err=True)
    sys.exit(code)


def aws_call(fn):
    """Run an AWS action, turning the usual failures into one clear line and an exit code."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    from launcher.backends.base import BackendError, JobFailedError, SettingError
    from launcher.backends.warm_pools import WarmPoolError
    from launcher.config.images import ImageResolutionError
    from launcher.local.store import DamagedRecord
    from launcher.wire.metric_lines import DamagedMetrics
    from launcher.wire.training.issues import SourceDirError

    try:
        return fn()
    except ConfigError as exc:
        report_invalid(exc)
        sys.exit(EXIT_INVALID)
    except (SourceDirError, ImageResolutionError, DamagedRecord, WarmPoolError, SettingError) as exc:
        fail(str(exc), EXIT_INVALID)
    except JobFailedError as exc:
        fail(str(exc), EXIT_FAILED)
    except NoCredentialsError:
        fail("no AWS credentials found: configure them (aws configure, AWS_PROFILE, or an instance "
              "role), or use --dry-run to see the request without sending it", EXIT_FAILED)
    except (ClientError, BotoCoreError, BackendError, DamagedMetrics) as exc:
        fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


def echo(line: str) -> None:
    click.echo(line)


def find(handle: str, region: str | None, printer=echo):
    """(backend, job) of a job handle (sagemaker:NAME, local:NAME, slurm:JOBID, or a bare name)."""
    from launcher.backends import registry

    return registry.find(handle, region=region, printer=printer)


JOB_HELP = ("JOB: a name, or backend:name (sagemaker:NAME, local:NAME, slurm:JOBID); a tuning job: its name "
            "(local, Slurm) or sagemaker-tuning:NAME.")
