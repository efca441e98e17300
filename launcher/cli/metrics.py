"""`smlaunch metrics`: a job's metrics as a table, JSON or a plot.

See launcher.backends.jobmetrics and launcher.cli.metrics_view.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

# Imports inside functions: the metrics loaders and matplotlib load when the command runs (CLI
# start-up).
from launcher.cli.support import (
    EXIT_INVALID,
    JOB_HELP,
    aws_call,
    fail,
    make_console,
    region_option,
)


def _plot_path(ctx, param, value: str | None) -> Path | None:
    """--plot is checked before any job is looked up, so a bad path costs nothing."""
    from launcher.cli.metrics_view import check_plot_path

    try:
        return None if value is None else check_plot_path(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@click.command(epilog=JOB_HELP + " Exit codes: 0 ok, 1 no such job or no metrics yet, 2 bad usage.")
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...")
@region_option
@click.option("--json", "as_json", is_flag=True, help="Print each job's records as JSON.")
@click.option("--plot", "plot_path", default=None, callback=_plot_path, metavar="FILE",
              help="Draw loss and validation loss, tokens/s and grad norm against step into FILE (.png, .svg, "
                   ".pdf); a script's own metrics (metric_definitions) one panel each; several jobs share the "
                   "picture.")
@click.option("--last", default=20, show_default=True, type=click.IntRange(min=1), help="Rows shown per job.")
@click.option("--all", "show_all", is_flag=True, help="Show every row.")
def metrics(jobs: tuple[str, ...], region: str | None, as_json: bool, plot_path: Path | None, last: int,
            show_all: bool) -> None:
    """A job's training metrics (local and Slurm: metrics.jsonl, or a script's metric_definitions on its log;
    SageMaker: output.tar.gz or CloudWatch; Kubernetes: metrics.jsonl in the job's S3 prefix, or on its claim
    where this machine mounts it)."""

    def run():
        from launcher.backends import jobmetrics
        from launcher.cli import metrics_view

        loaded = [jobmetrics.job_metrics(job, region) for job in jobs]
        if plot_path is not None:
            try:
                metrics_view.plot(loaded, plot_path, _trial_labels(loaded))
            except (ValueError, RuntimeError) as exc:
                fail(str(exc), EXIT_INVALID)
        if as_json:
            click.echo(json.dumps([{"job": m.handle, "source": m.source, "x": m.x, "records": m.records}
                                   for m in loaded], indent=2, default=str))
        else:
            console = make_console()
            for m in loaded:
                console.print(metrics_view.table(m, None if show_all else last))
        if plot_path is not None:
            click.echo(f"plot: {plot_path}", err=as_json)

    aws_call(run)


def _trial_labels(loaded) -> dict[str, str]:
    """A sweep's trial by its name and tuned values (`local:lr-3-002 (lr=0.0348579)`), for a plot's legend."""
    from launcher.cli.tuneview import values_text
    from launcher.tune.state import trial_values

    labels = {}
    for job in loaded:
        values = trial_values(job.handle.partition(":")[2])  # None but for a trial of a sweep run here
        if values:
            labels[job.handle] = f"{job.handle} ({values_text(values)})"
    return labels
