"""What `smlaunch tune`, `status SWEEP` and `list --tuning` print of a sweep: its trials as a table
(tuned values, status, objective; the best marked), and the dry run's planned trials. Names and
values are the user's: printed as data (launcher.wire.terminal.as_data), and as rich Text, which
reads no markup, in tables."""

from __future__ import annotations

import click

# Imports inside functions: rich's tables, and the sweep engine for a dry run, load when printed (CLI start-up).
from launcher.cli.support import make_console
from launcher.wire.terminal import as_data, printable


def _value(value) -> str:
    """A tuned value or an objective for reading: a float to 6 significant digits, a float's text
    (SageMaker's TunedHyperParameters are strings) too; anything else as data."""
    if isinstance(value, str) and any(c in value for c in ".eE"):
        try:
            value = float(value)
        except ValueError:
            pass
    return f"{value:.6g}" if isinstance(value, float) else as_data(value)


def values_text(values: dict) -> str:
    """`lr=0.000252984, layers=4`: tuned values for reading."""
    return ", ".join(f"{as_data(k)}={_value(v)}" for k, v in values.items())


def _cell(text: str):
    from rich.text import Text

    return Text(text)


def trials_table(desc: dict):
    from rich.table import Table

    config = desc["HyperParameterTuningJobConfig"]
    objective = config["HyperParameterTuningJobObjective"]
    trials = desc.get("TrainingJobs", [])
    names = list(dict.fromkeys(k for t in trials for k in t["TunedHyperParameters"]))
    best = (desc.get("BestTrainingJob") or {}).get("TrainingJobName")
    table = Table(title=f"{desc['HyperParameterTuningJobName']}: {desc['HyperParameterTuningJobStatus']}",
                  title_justify="left")
    for column in ("trial", "status", *map(as_data, names), f"{as_data(objective['MetricName'])} ({objective['Type']})",
                   "note"):
        table.add_column(_cell(column))
    for trial in trials:
        mark = " *" if trial["TrainingJobName"] == best else ""
        table.add_row(trial["TrainingJobName"] + mark, trial["TrainingJobStatus"],
                      *(_cell(_value(trial["TunedHyperParameters"].get(n, ""))) for n in names),
                      _objective(trial), _cell(as_data(_note(trial))))
    return table


def _objective(trial: dict) -> str:
    metric = trial.get("FinalHyperParameterTuningJobObjectiveMetric")
    if metric:
        return _value(metric["Value"])
    latest = trial.get("LatestObjective")
    return f"{_value(latest['Value'])} (step {latest['Step']:g}, running)" if latest else "-"


def _note(trial: dict) -> str:
    if trial.get("EarlyStopped"):
        return "stopped early: " + trial["EarlyStopped"]
    reason = trial.get("FailureReason") or ""
    return reason.splitlines()[0] if reason else ""


def print_status(desc: dict) -> None:
    console = make_console()
    console.print(trials_table(desc))
    counters = desc["TrainingJobStatusCounters"]
    click.echo(f"trials: {counters['Completed']} completed, {counters['InProgress']} running, "
               f"{counters['NonRetryableError']} failed, {counters['Stopped']} stopped; backend {desc['Backend']}")
    best = desc.get("BestTrainingJob")
    if best:
        metric = best["FinalHyperParameterTuningJobObjectiveMetric"]
        values = ", ".join(f"{as_data(k)}={as_data(v)}" for k, v in best["TunedHyperParameters"].items())  # exact
        click.echo(f"best (*): {best['TrainingJobName']}, {as_data(metric['MetricName'])} {_value(metric['Value'])} "
                   f"({values})")
    if desc.get("StatusMessage"):
        click.echo(desc["StatusMessage"])
    if desc.get("FailureReason"):
        click.echo(f"failure reason: {printable(desc['FailureReason'])}")


def sweeps_table(sweeps: list[dict]):
    from rich.table import Table

    table = Table()
    for column in ("tuning job", "status", "backend", "trials", "best trial", "best objective", "created"):
        table.add_column(column)
    for desc in sweeps:
        counters = desc["TrainingJobStatusCounters"]
        limit = desc["HyperParameterTuningJobConfig"]["ResourceLimits"].get("MaxNumberOfTrainingJobs", "-")
        best = desc.get("BestTrainingJob") or {}
        metric = best.get("FinalHyperParameterTuningJobObjectiveMetric")
        done = sum(counters.get(k, 0) for k in ("Completed", "NonRetryableError", "Stopped"))
        table.add_row(desc["HyperParameterTuningJobName"], desc["HyperParameterTuningJobStatus"], desc["Backend"],
                      f"{done}/{limit}", best.get("TrainingJobName", "-"),
                      _cell(f"{as_data(metric['MetricName'])} {_value(metric['Value'])}") if metric else "-",
                      (desc.get("CreationTime") or "")[:19])
    return table


def print_dry_run(job, tuning) -> None:
    """The trials a sweep would start: each one's values, checked as its job (Grid, Random), or what a
    Bayesian sweep does instead."""
    from launcher.tune.strategies import strategy_for
    from launcher.tune.trials import base_job_data, trial_job

    seed = tuning.random_seed if tuning.random_seed is not None else 0
    planned = strategy_for(tuning, seed).upfront()
    click.echo(f"{tuning.strategy} sweep over {', '.join(map(as_data, tuning.ranges))}: {tuning.trial_count()} "
               f"trial(s), {tuning.max_parallel_jobs} at a time, objective {tuning.objective.type} "
               f"{as_data(tuning.objective.metric)}, "
               f"early stopping {tuning.early_stopping}, backend {job.config.backend_name}")
    if planned is None:
        click.echo("Bayesian: each trial's values are chosen as the earlier trials' results arrive "
                   f"(Optuna's TPE sampler, seed {tuning.random_seed if tuning.random_seed is not None else 'random'})")
        return
    if tuning.strategy == "Random" and tuning.random_seed is None:
        click.echo("no random_seed: the values below are seed 0's; the sweep draws with a seed of its own, "
                   "recorded in its state (set tuning.random_seed to fix them)")
    base = base_job_data(job.config)
    for index, values in enumerate(planned):
        trial_job(base, job.base_dir, values)  # ConfigError (exit 2) if the job's rules refuse this trial
        click.echo(f"  trial {index + 1}: " + values_text(values))
