"""`smlaunch plan`: one plan, a sweep, or `--auto`'s search (launcher.plan has the arithmetic)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

# Imports inside functions: the planner loads when the command runs (CLI start-up).
from launcher.cli.support import (
    EXIT_FAILED,
    EXIT_INVALID,
    fail,
    job_file_arg,
    make_console,
    report_invalid,
    set_option,
)
from launcher.wire.training.issues import ConfigError


class PositiveNumber(click.ParamType):
    """A finite number above 0 (float() takes 'nan', 'inf' and '-5')."""

    name = "number"

    def __init__(self, what: str, example: str):
        self.what, self.example = what, example

    def convert(self, value, param, ctx) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            # the project's error line (field = value: problem; fix), as every other refusal of plan
            fail(f"{param.opts[0]} = {value}: not {self.what} above 0; give a positive number, e.g. {self.example}",
                 EXIT_INVALID)
        return number


@click.command(name="plan")
@job_file_arg
@set_option
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="Plan every value (combined with other --sweep options), e.g. context_parallel_degree=1,2,4,8.")
@click.option("--auto", "auto_pick", is_flag=True,
              help="Search instance types, counts, tp/cp/hsd/pp, micro batch and checkpointing; print the Pareto "
                   "table (time vs $) of what fits. With --sweep: the cheapest of the swept configurations.")
@click.option("--instance-types", default=None, metavar="T1,T2,...",
              help="--auto: the instance types to search, e.g. ml.p4d.24xlarge,ml.p5.48xlarge.")
@click.option("--family", "families", default=None, metavar="F1,F2,...",
              help="--auto: search every type of these families, e.g. p4d,p5.")
@click.option("--max-instances", type=int, default=None,
              help="--auto: search instance counts 1, 2, 4, ... up to this (default 4; with --deadline, double "
                   "until the deadline is met, up to 64).")
@click.option("--deadline", default=None, metavar="DURATION",
              help="--auto with --tokens: only configurations that train the tokens within it, e.g. 48h, 2d.")
@click.option("--tokens", type=PositiveNumber("a number of tokens", "1e9"), default=None,
              help="Also give hours and dollars for this many tokens (e.g. 1e9).")
@click.option("--failure-rate", type=PositiveNumber("a rate of interruptions per GPU-hour", "2e-5"), default=None,
              help="Interruptions per GPU-hour for the goodput plan (default: Llama 3's 419 in 54 days on "
                   "16,384 GPUs, 1.97e-5).")
@click.option("--checkpoint-write-gb-s", "write_gb_s", type=PositiveNumber("a bandwidth in GB/s", "2"), default=None,
              help="One host's checkpoint write and read bandwidth, GB/s, for the goodput plan (default 1).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per configuration, in a list "
              "(--auto's search: one object with the Pareto rows).")
@click.option("--trace", "trace", is_flag=True,
              help="Also run the runtime's own code for the job's whole world on a fake process group (one "
                   "training step on fake tensors, no GPU; needs torch) and print each traced rank's parameters, "
                   "gradients, optimizer state, peak and collectives beside the plan (with --auto: the picked, "
                   "cheapest configuration).")
@click.option("--data", "data", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Indexed token shards on this machine (a copy of the training data, e.g. pack's DIR/train): "
                   "the attention FLOPs are planned from their documents' lengths (dataset_type: indexed, "
                   "document masking on). A job's local channels are read without it.")
def plan_cmd(job_file: Path, overrides: tuple[str, ...], sweeps: tuple[str, ...], auto_pick: bool,
             instance_types: str | None, families: str | None, max_instances: int | None, deadline: str | None,
             tokens: float | None, failure_rate: float | None, write_gb_s: float | None, as_json: bool,
             trace: bool, data: Path | None) -> None:
    """Predict memory per GPU, speed and cost before launch; explain a predicted OOM.

    Exit codes: 0 the (picked) configuration fits, 1 it does not (or none does, or none meets
    --deadline), 2 invalid job or option (or a job that cannot be planned: its model or world
    size is unknown).
    """
    from launcher import plan as planner
    from launcher.plan.report import speed_lines
    from launcher.plan.workload import documents_from

    documents_from.set(data.resolve() if data is not None else None)
    search_options = {"--instance-types": instance_types, "--family": families,
                      "--max-instances": max_instances, "--deadline": deadline}
    _check_search_options(search_options, auto_pick, sweeps)
    _check_goodput_options({"--failure-rate": failure_rate, "--checkpoint-write-gb-s": write_gb_s},
                           auto_pick, sweeps)
    goodput_of = _goodput_planner(failure_rate, write_gb_s)
    if trace and sweeps and not auto_pick:
        fail("--trace traces one configuration, not --sweep's; add --auto to trace the one it picks, or plan the "
             "configuration you picked with --set and --trace", EXIT_INVALID)
    if auto_pick and not sweeps:
        _plan_search(job_file, overrides, instance_types, families, max_instances, tokens, deadline, as_json, trace)
    try:
        if auto_pick:
            best, results = planner.auto_job_file(job_file, overrides, sweeps)
        elif sweeps:
            best, results = None, planner.sweep_job_file(job_file, overrides, sweeps)
        else:
            from launcher.config.jobfile import validate_job_file

            results = [planner.plan(validate_job_file(job_file, overrides))]
            best = None
    except ConfigError as exc:
        report_invalid(exc)
        sys.exit(EXIT_INVALID)
    chosen = best if auto_pick else (results[0] if len(results) == 1 else None)
    traced = _trace(chosen) if trace else None
    if as_json:
        rows = []
        for r in results:
            row = r.to_dict()
            if auto_pick:
                row["picked"] = r is best
            if tokens and r.throughput:
                hours, usd = r.throughput.cost_for(tokens=tokens)
                row.update(hours_for_tokens=round(hours, 3), usd_for_tokens=None if usd is None else round(usd, 2))
            goodput = goodput_of(r)
            row["goodput"] = goodput.to_dict() if goodput else None
            if traced is not None and r is chosen:
                from launcher.plan.trace_report import trace_dict

                row["trace"] = trace_dict(traced)
            rows.append(row)
        click.echo(json.dumps(rows, indent=2, default=str))
    else:
        console = make_console()
        if chosen is not None and chosen.nothing_to_plan:  # a local job, a script without its model: no error
            console.print(f"models: nothing: {chosen.nothing_to_plan}", highlight=False, markup=False)
            sys.exit(0)
        if results and results[0].models:
            console.print(f"models: {results[0].models}", highlight=False, markup=False)
        console.print(planner.render_table(results, best=best, title=f"plan: {job_file}"))
        if chosen is not None and chosen.valid:
            for line in speed_lines(chosen, goodput_of(chosen), tokens):
                console.print(line, highlight=False, markup=False)
            if auto_pick:
                console.print(f"picked: {planner.describe(chosen)}  (--set " + " --set ".join(chosen.overrides) + ")"
                              if chosen.overrides else f"picked: {planner.describe(chosen)}")
            if chosen.oom or not auto_pick:
                console.print(planner.explain_oom(chosen.memory), highlight=False, markup=False)
            if chosen.staging is not None:
                console.print(chosen.staging.text(), highlight=False, markup=False)
            if traced is not None:
                from launcher.plan.trace_report import trace_lines

                for line in trace_lines(traced):
                    console.print(line, highlight=False, markup=False)
        elif auto_pick:
            console.print("no configuration fits: see the table for the lowest peaks")
        elif len(results) == 1 and not results[0].valid:
            console.print("cannot plan: " + "; ".join(results[0].errors), markup=False)
    if chosen is not None and chosen.nothing_to_plan:
        sys.exit(0)
    if chosen is None:
        sys.exit(EXIT_FAILED if auto_pick or not any(r.fits for r in results) else 0)
    if not chosen.valid:  # nothing to plan (the model or world size is unknown): the job needs a fix
        sys.exit(EXIT_INVALID)
    sys.exit(EXIT_FAILED if chosen.oom else 0)


def _trace(chosen):
    """The trace of the planned job (launcher.plan.trace), or None when there is nothing to trace
    (an invalid job or one without a model: plan says why and exits as it does without --trace)."""
    if chosen is None or not chosen.valid or chosen.nothing_to_plan:
        return None
    from launcher.plan.trace import TraceError, run_trace

    try:
        return run_trace(chosen.job)
    except TraceError as exc:
        fail(f"trace: {exc}", EXIT_INVALID)


def _check_search_options(options: dict, auto_pick: bool, sweeps: tuple[str, ...]) -> None:
    """The search's options mean nothing to a single plan or an explicit --sweep."""
    given = [name for name, value in options.items() if value is not None]
    if given and (sweeps or not auto_pick):
        fix = "drop --sweep to search, or drop them" if sweeps else "add --auto"
        fail(f"{', '.join(given)}: only for `plan --auto` (the search), not for "
              f"{'--sweep' if sweeps else 'a single plan'}; {fix}", EXIT_INVALID)


def _check_goodput_options(options: dict, auto_pick: bool, sweeps: tuple[str, ...]) -> None:
    """--auto's search ranks by time and dollars and plans no goodput: its options would do nothing."""
    given = [name for name, value in options.items() if value is not None]
    if given and auto_pick and not sweeps:
        fail(f"{', '.join(given)}: for a single plan or --sweep, not for `plan --auto`'s search; plan the picked "
             "configuration with them", EXIT_INVALID)


def _goodput_planner(failure_rate: float | None, write_gb_s: float | None):
    """PlanResult -> its GoodputPlan (or None), at the options' values or the documented defaults."""
    from launcher.plan import goodput

    rate = goodput.DEFAULT_FAILURE_RATE if failure_rate is None else failure_rate
    bandwidth = goodput.DEFAULT_WRITE_GB_S if write_gb_s is None else write_gb_s
    return lambda result: goodput.plan_goodput(result.job, result.throughput, result.memory, rate, bandwidth)


def _plan_search(job_file: Path, overrides, instance_types, families, max_instances, tokens, deadline,
                 as_json: bool, trace: bool = False) -> None:
    """`plan --auto`: search, print the Pareto table (or JSON), exit 0 when something fits
    (within --deadline), 1 when nothing does, 2 for an invalid job or option. With `trace`, the
    cheapest configuration (the one a single `--auto --sweep` picks too) is traced after it."""
    from launcher.plan.search import SearchOptionError, search_job_file
    from launcher.plan.workload import PlanError

    try:
        found = search_job_file(job_file, overrides, instance_types=instance_types, families=families,
                                max_instances=max_instances, tokens=tokens, deadline=deadline)
    except SearchOptionError as exc:
        fail("\n       ".join(str(i) for i in exc.issues), EXIT_INVALID)
    except ConfigError as exc:
        report_invalid(exc)
        sys.exit(EXIT_INVALID)
    except PlanError as exc:
        fail(f"cannot plan {job_file}: {exc}", EXIT_INVALID)
    from launcher.plan.search_report import describe_row, print_search, search_to_dict

    traced = _trace(found.cheapest) if trace else None
    if as_json:
        result = search_to_dict(found)
        if traced is not None:  # in the cheapest row's object, as a single plan's trace is in its own
            from launcher.plan.trace_report import trace_dict

            next(row for row in result["pareto"] if row["cheapest"])["trace"] = trace_dict(traced)
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        console = make_console()
        print_search(console, found, title=f"plan --auto: {job_file} (Pareto front, time vs $)")
        if traced is not None:
            from launcher.plan.trace_report import trace_lines

            console.print(f"traced: the cheapest, {describe_row(found, found.cheapest)}", markup=False)
            for line in trace_lines(traced):
                console.print(line, highlight=False, markup=False)
        elif trace:
            console.print("nothing traced: no configuration qualifies", markup=False)
    sys.exit(0 if found.front else EXIT_FAILED)
