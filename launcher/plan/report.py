"""A configuration's plan (`PlanResult`) and what the planner prints of it: a table of
configurations, a plan in words (`PlanResult.report()`, `smlaunch plan`), and why a job would run
out of memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.config import ValidatedJob
from launcher.plan.goodput import GoodputPlan, plan_goodput
from launcher.plan.host_staging import HostStaging
from launcher.plan.memory import PHASES, MemoryEstimate
from launcher.plan.throughput import ThroughputEstimate
from launcher.plan.workload import modeled_program
from launcher.wire.training.degrees import DEGREES


@dataclass
class PlanResult:
    """One configuration: what identifies it, and its plan (or why it has none)."""

    settings: dict[str, Any]
    overrides: tuple[str, ...] = ()  # the sweep's --set strings that made this configuration
    memory: MemoryEstimate | None = None
    throughput: ThroughputEstimate | None = None
    errors: list[str] = field(default_factory=list)  # validation errors, or why it cannot be planned
    job: ValidatedJob | None = field(default=None, repr=False)
    # why nothing is planned, where that is no error: a local job (this machine), a script of the
    # user's own that does not say its model
    nothing_to_plan: str | None = None
    staging: HostStaging | None = None  # host memory of asynchronous checkpoints, when the job has them
    no_throughput: str | None = None  # why a planned job has no speed and cost (throughput.estimate_or_reason)

    @property
    def models(self) -> str | None:
        """What the plan models (launcher.plan.workload.modeled_program)."""
        return modeled_program(self.job) if self.job is not None else None

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def fits(self) -> bool | None:
        """True/False against the accelerator's memory; None when invalid or capacity unknown."""
        return self.memory.fits if self.memory else None

    @property
    def oom(self) -> bool:
        return self.memory is not None and self.memory.oom

    @property
    def tokens_per_s(self) -> float | None:
        return self.throughput.tokens_per_s if self.throughput else None

    @property
    def usd_per_billion_tokens(self) -> float | None:
        return self.throughput.usd_per_billion_tokens if self.throughput else None

    def report(self) -> str:
        """What `smlaunch plan` says of this job, as text (print it)."""
        return report(self)

    def __repr__(self) -> str:
        return f"PlanResult({summary(self)})"

    def to_dict(self) -> dict:
        mem, speed = self.memory, self.throughput
        out = {
            "valid": self.valid,
            "errors": self.errors,
            "models": self.models,
            **({"nothing_to_plan": self.nothing_to_plan} if self.nothing_to_plan else {}),
            "overrides": list(self.overrides),
            **self.settings,
            "fits": self.fits,
            "peak_gib": round(mem.peak_gib, 3) if mem else None,
            "capacity_gib": mem.capacity_gib if mem else None,
            "largest_allocation_gib": round(mem.largest_allocation.gib, 3) if mem else None,
            "largest_allocation": mem.largest_allocation.name if mem else None,
            "dominant": mem.dominant.key if mem else None,
            "tokens_per_s": round(speed.tokens_per_s, 1) if speed else None,
            "step_s": round(speed.step_s, 4) if speed else None,
            "usd_per_hour": speed.usd_per_hour if speed else None,
            "usd_per_billion_tokens": None if self.usd_per_billion_tokens is None
            else round(self.usd_per_billion_tokens, 2),
            **({"no_throughput": self.no_throughput} if self.no_throughput else {}),
        }
        out["memory"] = mem.to_dict() if mem else None
        out["throughput"] = speed.to_dict() if speed else None
        out["host_staging"] = self.staging.to_dict() if self.staging else None
        return out


_SETTING_LABELS = {
    **{d.key: d.short for d in DEGREES},
    "hyperparameters.activation_checkpointing": "ac",
    "hyperparameters.train_batch_size": "batch",
}
_PART_LABELS = {"compute": "compute", "communication": "comm", "bubble": "bubble"}


def describe(result: PlanResult) -> str:
    """A short name for a configuration: its sweep overrides, or its parallel settings."""
    if result.overrides:
        return " ".join(_short(o) for o in result.overrides)
    s = result.settings
    ac = s.get("activation_checkpointing")
    # an SMP v1 job shards over sharded_data_parallel_degree where hybrid_shard_degree leaves it open
    sdp = s.get("sharded_data_parallel_degree")
    shard = f"sdp={sdp}" if sdp and not s.get("hybrid_shard_degree") else f"hsd={s.get('hybrid_shard_degree')}"
    return (f"cp={s.get('context_parallel_degree')} {shard} "
            f"tp={s.get('tensor_parallel_degree')} ac={ac or 'off'} batch={s.get('train_batch_size')}")


def summary(result: PlanResult) -> str:
    """One line: where, which configuration, and what it comes to (a plan's repr in a notebook)."""
    s = result.settings
    where = f"{s.get('instance_type')} x {s.get('instance_count')}"
    if not result.valid:
        return f"{where}: invalid: {_first_error(result)}"
    if result.nothing_to_plan:
        return f"{where}: nothing to plan"
    mem, speed, usd = result.memory, result.throughput, result.usd_per_billion_tokens
    fits = {True: "fits", False: "does not fit", None: "capacity unknown"}[mem.fits]
    capacity = f" of {mem.capacity_gib:g}" if mem.capacity_gib is not None else ""
    line = f"{where}, {describe(result)}: {fits}, peak {mem.peak_gib:.1f}{capacity} GiB"
    if speed:
        line += f", {speed.tokens_per_s:,.0f} tokens/s"
    return line + (f", ${usd:,.0f} per billion tokens" if usd is not None else "")


def report(result: PlanResult) -> str:
    """What `smlaunch plan` says of one job, as text: what it models, the configuration in one
    line, speed, goodput (at the default failure rate) and memory."""
    if result.nothing_to_plan:
        return f"models: nothing: {result.nothing_to_plan}"
    if not result.valid:
        return "cannot plan: " + "; ".join(result.errors)
    lines = [f"models: {result.models}", summary(result)]
    lines += speed_lines(result, plan_goodput(result.job, result.throughput, result.memory))
    lines.append(explain_oom(result.memory))
    if result.staging is not None:
        lines.append(result.staging.text())
    return "\n".join(lines)


def speed_lines(result: PlanResult, goodput: GoodputPlan | None, tokens: float | None = None) -> list[str]:
    """The step's FLOPs, time and parts, what its speed is borrowed from, the goodput and the
    time and cost of `tokens`; or why there is no speed."""
    speed = result.throughput
    if speed is None:
        return [f"speed and cost: not planned: {result.no_throughput}"] if result.no_throughput else []
    lines = [f"{speed.formula}: {speed.tflops_per_gpu:.0f} TFLOPS/GPU "
             f"({speed.tflops_per_gpu_seed_formula:.0f} by the seed's formula)"]
    if speed.borrowed:
        lines.append(speed.borrowed)
    lines.append(explain_step(speed))
    if goodput is not None:
        lines.append(goodput.text())
    if tokens:
        hours, usd = speed.cost_for(tokens=tokens)
        lines.append(f"{tokens:,.0f} tokens: {hours:,.1f} h" + (f", ${usd:,.0f}" if usd is not None else ""))
    return lines


def render_table(results: Sequence[PlanResult], best: PlanResult | None = None, title: str | None = None):
    """A rich Table, one row per configuration; `best` (e.g. auto()'s pick) is marked."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name, justify in (("configuration", "left"), ("fits", "center"), ("peak / capacity GiB", "right"),
                          ("largest allocation", "left"), ("dominant", "left"), ("tokens/s", "right"),
                          ("step s", "right"), ("bound by", "left"), ("$ / B tokens", "right")):
        table.add_column(name, justify=justify)
    for result in results:
        name = ("[bold]* " if result is best else "") + describe(result) + ("[/bold]" if result is best else "")
        if not result.valid:
            table.add_row(name, "[yellow]invalid[/yellow]", "", _first_error(result), "", "", "", "", "")
            continue
        mem, speed = result.memory, result.throughput
        fits = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "?"}[mem.fits]
        capacity = f"{mem.capacity_gib:g}" if mem.capacity_gib is not None else "?"
        largest = f"{mem.largest_allocation.gib:.2f} {mem.largest_allocation.name}"
        usd = result.usd_per_billion_tokens
        table.add_row(name, fits, f"{mem.peak_gib:.1f} / {capacity}", largest,
                      f"{mem.dominant.name} {mem.dominant.gib:.1f}",
                      f"{speed.tokens_per_s:,.0f}" if speed else "-", f"{speed.step_s:.2f}" if speed else "-",
                      bound_by(speed) if speed else "-", f"{usd:,.0f}" if usd is not None else "-")
    return table


def bound_by(speed: ThroughputEstimate) -> str:
    """What dominates the step, with the shares of the rest: "compute (comm 2%)"."""
    parts, top = speed.step.parts, speed.bound_by
    rest = ", ".join(f"{_PART_LABELS[k]} {_share(v / speed.step_s)}" for k, v in parts.items() if v and k != top)
    return top + (f" ({rest})" if rest else "")


def explain_step(speed: ThroughputEstimate) -> str:
    """The step time as compute + exposed communication + bubble, each collective with its time
    on the wire, the part compute does not hide, and the link it runs on."""
    head = (f"step {speed.step_s:.3f} s = compute {speed.compute_s:.3f} + communication not hidden "
            f"{speed.communication_s:.3f} + pipeline bubble {speed.bubble_s:.3f}: bound by {speed.bound_by}")
    lines = [head]
    names = {"fsdp": "FSDP all-gather/reduce-scatter", "cp": "context-parallel K/V exchange",
             "tp": "tensor-parallel all-gather/reduce-scatter"}
    for c in speed.step.communication:
        lines.append(f"  {names[c.name]}: {c.total_s:.3f} s on the wire, {c.exposed_s:.3f} s not hidden ({c.link})")
    return "\n".join(lines)


def explain_oom(estimate: MemoryEstimate) -> str:
    """Why the job is predicted not to fit and what fixes it (what `submit` prints to refuse)."""
    where = estimate.instance_type or "this instance"
    if estimate.accelerator:
        where += f" ({estimate.accelerator})"
    lines = []
    if estimate.fits is None:
        lines.append(f"Predicted peak {estimate.peak_gib:.2f} GiB per process on {where}; "
                     "its accelerator memory is unknown.")
    else:
        verdict = "does not fit" if estimate.oom else "fits"
        lines.append(f"Predicted peak {estimate.peak_gib:.2f} GiB per GPU on {where} {verdict}: "
                     f"{estimate.usable_gib:.2f} GiB usable of {estimate.capacity_gib:g} GiB "
                     f"({_pct(1 - estimate.usable_gib / estimate.capacity_gib)} kept free).")
    lines.append(f"The peak is at the {PHASES[estimate.peak_phase]}.")
    dom = estimate.dominant
    lines.append(f"Dominant term: {dom.name}, {dom.gib:.2f} GiB ({dom.formula}).")
    big = estimate.largest_allocation
    largest = f"Largest single allocation: {big.name}, {big.gib:.2f} GiB ({big.formula})"
    if estimate.accelerator:
        largest += f"; a CUDA OOM there reads \"Tried to allocate {big.gib:.2f} GiB\""
    lines.append(largest + ".")
    if estimate.advice:
        fitting = [f for f in estimate.advice if f.fits is not False]
        lines.append("Fixes, each validated and re-planned:" if fitting else
                     "No single setting makes it fit; these lower the peak most:")
        for fix in estimate.advice:
            usd = f", ${fix.usd_per_billion_tokens:,.0f} per billion tokens" if fix.usd_per_billion_tokens else ""
            verdict = "fits" if fix.fits else ("does not fit" if fix.fits is False else "capacity unknown")
            lines.append(f"  --set {' --set '.join(fix.overrides)}: peak {fix.peak_gib:.2f} GiB, {verdict}{usd}")
    elif estimate.oom:
        lines.append("No setting smlaunch can change lowers the peak: use an instance type with more "
                     "accelerator memory, a shorter max_context_width, or a smaller model.")
    return "\n".join(lines)


def _short(override: str) -> str:
    key, _, value = override.partition("=")
    return f"{_SETTING_LABELS.get(key, key.rsplit('.', 1)[-1])}={value}"


def _first_error(result: PlanResult) -> str:
    text = result.errors[0] if result.errors else ""
    text = text.replace("distribution.smdistributed.modelparallel.parameters.", "")
    return text if len(text) <= 90 else text[:87] + "..."


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.005 else "<1%"


def _pct(x: float) -> str:
    return f"{x:.0%}"
