"""What `plan --auto` prints: the Pareto table of its search (time against dollars), the `--set`
lines of each row, and what was searched and skipped."""

from __future__ import annotations

from typing import Any

from launcher.plan.report import PlanResult
from launcher.plan.search import SearchResult, set_lines


def print_search(console, found: SearchResult, title: str) -> None:
    """What the plans model (first, as a single plan says it), the summary, the Pareto table and
    each row's --set lines; or, when nothing qualifies, why."""
    if found.models:
        console.print(f"models: {found.models}", highlight=False, markup=False)
    for line in summary_lines(found):
        console.print(line, markup=False)
    if found.front:
        console.print(render_front(found, title=title))
        for i, r in enumerate(found.front, 1):
            console.print(f"{i}: {set_text(found, r)}", markup=False)
    elif found.deadline_h is not None and found.fastest_fitting is not None:
        console.print(f"no configuration meets the deadline of {found.deadline_h:g} h; the fastest that fits: "
                      f"{describe_row(found, found.fastest_fitting)}", markup=False)
        console.print(set_text(found, found.fastest_fitting), markup=False)
    else:
        console.print("no configuration fits: try more instance types (--family) or counts (--max-instances)")


def render_front(found: SearchResult, title: str | None = None):
    """A rich Table of the Pareto front, cheapest first, the cheapest and fastest marked."""
    from rich.table import Table

    per = "for the tokens" if found.tokens != 1e9 else "per B tokens"
    table = Table(title=title, title_justify="left")
    for name, justify in (("#", "right"), ("pick", "left"), ("instance x count", "left"),
                          ("tp cp hsd pp", "left"), ("batch x accum", "right"), ("ac", "center"),
                          ("peak / capacity GiB", "right"), ("tokens/s", "right"), ("step s", "right"),
                          (f"hours {per}", "right"), (f"$ {per}", "right")):
        table.add_column(name, justify=justify)
    for i, r in enumerate(found.front, 1):
        table.add_row(str(i), _pick(found, r), *_cells(found, r))
    return table


def summary_lines(found: SearchResult) -> list[str]:
    """How much was searched, what was skipped and why."""
    counts = ", ".join(str(c) for c in found.instance_counts)
    lines = [(f"searched {len(found.results):,} configurations ({sum(r.valid for r in found.results):,} valid, "
              f"{sum(bool(r.fits) for r in found.results):,} fit) over {len(found.instance_types)} instance types "
              f"x counts {counts}: {', '.join(found.instance_types)}")]
    for skip in found.skipped:
        where = " x ".join(str(x) for x in (skip.instance_type, skip.instance_count) if x is not None)
        lines.append(f"skipped {where or 'everywhere'}: {skip.reason}")
    by_text: dict[str, list[str]] = {}
    for name, borrowed in found.uncalibrated.items():
        by_text.setdefault(borrowed, []).append(name)
    lines += [f"speed of {', '.join(names)}: {borrowed}" for borrowed, names in by_text.items()]
    return lines


def set_text(found: SearchResult, result: PlanResult) -> str:
    lines = set_lines(result, found.base)
    return " ".join(f"--set {s}" for s in lines) if lines else "(the job as it is)"


def describe_row(found: SearchResult, r: PlanResult) -> str:
    """One line for a configuration outside the table (the fastest, when the deadline is missed)."""
    hours, usd = found.hours_usd(r)
    s = r.settings
    cost = f", ${usd:,.0f}" if usd is not None else ""
    return f"{s['instance_type']} x {s['instance_count']}: {hours:,.1f} h{cost}"


def _pick(found: SearchResult, r: PlanResult) -> str:
    marks = [m for m, best in (("cheapest", found.cheapest), ("fastest", found.fastest)) if r is best]
    return "[bold]" + ", ".join(marks) + "[/bold]" if marks else ""


def _cells(found: SearchResult, r: PlanResult) -> list[str]:
    s, mem, speed = r.settings, r.memory, r.throughput
    hours, usd = found.hours_usd(r)
    return [f"{s['instance_type']} x {s['instance_count']}",
            f"{s['tensor_parallel_degree']} {s['context_parallel_degree']} "
            f"{s['hybrid_shard_degree']} {s['pipeline_parallel_degree']}",
            f"{s['train_batch_size']} x {s['gradient_accumulation_steps']}",
            "on" if s["activation_checkpointing"] else "off",
            f"{mem.peak_gib:.1f} / {mem.capacity_gib:g}",
            f"{speed.tokens_per_s:,.0f}", f"{speed.step_s:.2f}",
            f"{hours:,.2f}", "-" if usd is None else f"{usd:,.0f}"]


def search_to_dict(found: SearchResult) -> dict[str, Any]:
    """The search as data: what was tried and skipped, and the front with its --set lines."""
    rows = []
    for r in found.front:
        hours, usd = found.hours_usd(r)
        rows.append({**r.to_dict(), "set": set_lines(r, found.base), "hours": round(hours, 4),
                     "usd": None if usd is None else round(usd, 2),
                     "cheapest": r is found.cheapest, "fastest": r is found.fastest})
    fastest = found.fastest_fitting
    return {
        "models": found.models,
        "tried": len(found.results),
        "valid": sum(r.valid for r in found.results),
        "fit": sum(bool(r.fits) for r in found.results),
        "instance_types": found.instance_types,
        "instance_counts": found.instance_counts,
        "tokens": found.tokens,
        "deadline_hours": found.deadline_h,
        "deadline_met": None if found.deadline_h is None else bool(found.front),
        "skipped": [s.to_dict() for s in found.skipped],
        "uncalibrated": found.uncalibrated,
        "pareto": rows,
        "fastest_fitting": None if fastest is None else {
            **fastest.to_dict(), "set": set_lines(fastest, found.base), "hours": round(found.hours_usd(fastest)[0], 4)},
    }
