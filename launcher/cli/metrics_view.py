"""Jobs' metrics as a table (rich) and as a picture (matplotlib), both imported only when drawn.

smlaunch's runtime's records (metrics.jsonl, CloudWatch) show its columns, and the picture has three
panels sharing the x axis: training loss (solid) and validation loss (dots on a dashed line),
tokens/s, and gradient norm; one colour per job, named in the legend. A restarted job's curves have
each step once (the latest attempt's) and a dotted line where each restart resumed. A script of the
user's own has the metrics its metric_definitions name (x `point`, launcher.backends.log_metrics):
one column and one panel each.
"""

from __future__ import annotations

from pathlib import Path

from launcher.backends.log_metrics import POINT
from launcher.backends.metric_records import JobMetrics
from launcher.wire.terminal import as_data

PLOT_FORMATS = (".png", ".svg", ".pdf")
# (record key, column heading, format)
COLUMNS = (("loss", "loss", "{:.4f}"), ("val_loss", "val loss", "{:.4f}"), ("grad_norm", "grad norm", "{:.3f}"),
           ("lr", "lr", "{:.3g}"), ("tokens_per_s", "tokens/s", "{:,.0f}"))
X_LABELS = {"step": "step", "elapsed_s": "seconds since the job started",
            POINT: "value no. (per metric, in log order)"}
PANELS = (("loss", "loss"), ("tokens_per_s", "tokens/s"), ("grad_norm", "grad norm"))
SCRIPT_FORMAT = "{:.6g}"  # a script's own metric: its scale is not known


def check_plot_path(value: str) -> Path:
    """The --plot file, if it can be written: ValueError naming the value and the fix if not."""
    path = Path(value).expanduser()
    if path.is_dir():
        raise ValueError(f"{value!r} is a directory: give a file name, e.g. {path / 'loss.png'}")
    if path.suffix.lower() not in PLOT_FORMATS:
        raise ValueError(f"{value!r} is not a {', '.join(PLOT_FORMATS)} file: name the picture e.g. loss.png")
    if not path.parent.is_dir():
        raise ValueError(f"{value!r}: directory {str(path.parent)!r} does not exist; create it or pick another place")
    return path


def rows(job: JobMetrics) -> list[dict]:
    """One row per step (or minute): a validation record joins the training record of its step."""
    merged: dict = {}
    for record in job.records:
        x = record.get(job.x)
        if x is not None:
            merged.setdefault(x, {}).update(record)
    return [merged[x] for x in sorted(merged)]


def _script_metrics(jobs: list[JobMetrics]) -> list[str]:
    """The metrics of script jobs' records (metric_definitions' names), in the order first seen."""
    return list(dict.fromkeys(key for job in jobs for record in job.records for key in record if key != job.x))


def table(job: JobMetrics, last: int | None):
    """A rich Table of the job's last `last` rows (all of them for None)."""
    from rich.table import Table
    from rich.text import Text

    shown = rows(job)
    hidden = len(shown) - last if last is not None and len(shown) > last else 0
    shown = shown[hidden:]
    caption = f"{hidden} earlier row(s) not shown (--all shows them)" if hidden else None
    # a script's metric names (and the source naming them) are the user's: data, not markup or escapes
    out = Table(title=Text(as_data(f"{job.handle}  ({job.source})")), caption=caption, title_justify="left")
    out.add_column(X_LABELS[job.x], justify="right")
    if job.x == POINT:
        keys = [(name, name, SCRIPT_FORMAT) for name in _script_metrics([job])]
    else:
        keys = [c for c in COLUMNS if any(c[0] in r for r in shown)]
    for _, heading, _ in keys:
        out.add_column(Text(as_data(heading)), justify="right")
    for row in shown:
        out.add_row(str(row[job.x]), *(fmt.format(row[key]) if row.get(key) is not None else ""
                                        for key, _, fmt in keys))
    return out


def plot(jobs: list[JobMetrics], path: Path | None = None, labels: dict[str, str] | None = None):
    """A matplotlib Figure of the jobs' curves, saved to `path` when given (Agg: no display needed).
    `labels`: a job's name in the legend by its handle (a sweep's trial: with its tuned values)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install 'smlaunch[plot]'") from None
    xs = {job.x for job in jobs}
    if len(xs) > 1:
        raise ValueError("these jobs' metrics cannot share an x axis: " + ", ".join(
            f"{j.handle} by {X_LABELS[j.x]}" for j in jobs) + "; plot them separately")
    x = xs.pop()
    panels = [(name, name) for name in _script_metrics(jobs)] if x == POINT else PANELS
    fig = Figure(figsize=(8, max(4.0, 8 / 3 * len(panels))), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    colors = [f"C{i % 10}" for i in range(len(jobs))]
    for job, color in zip(jobs, colors):
        label = (labels or {}).get(job.handle, job.handle)
        for ax, (key, _) in zip(axes, panels):
            steps, values = job.series(key)
            if steps:
                ax.plot(steps, values, color=color, label=label)
        steps, values = job.series("val_loss") if x != POINT else ([], [])
        if steps:
            axes[0].plot(steps, values, color=color, linestyle="--", marker="o", label=f"{label} (validation)")
        _mark_restarts(axes, job, color)
    for ax, (_, label) in zip(axes, panels):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(X_LABELS[x])
    if x == POINT:
        from matplotlib.ticker import MaxNLocator

        axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # values are counted: no 2.5th
    axes[0].set_title(", ".join(job.handle for job in jobs))
    axes[0].legend(fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _mark_restarts(axes, job: JobMetrics, color: str) -> None:
    """A dotted vertical line on every panel at each step a restart resumed from (its curves then
    go on from there: the replayed steps are drawn once, as the latest attempt ran them)."""
    for number, step in enumerate(job.restarts()):
        for ax in axes:
            ax.axvline(step, color=color, linestyle=":", linewidth=1.2,
                       label=f"{job.handle} restarted" if ax is axes[0] and number == 0 else None)
