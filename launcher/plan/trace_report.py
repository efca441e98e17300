"""The trace beside the plan, in words and as JSON (`smlaunch plan --trace`): each traced rank's
parameters, gradients, optimizer state and peak next to the planner's, a difference over
FLAG_AT flagged with what explains it, and the collectives the step issued."""

from __future__ import annotations

from launcher.plan.trace import Trace
from launcher.wire.training.layout import ParallelLayout

GIB = 2**30
FLAG_AT = 0.10  # a difference larger than this share of the traced figure is flagged
LABELS = {"parameter_bytes": "parameters", "gradient_bytes": "gradients", "optimizer_bytes": "optimizer state",
          "peak_bytes": "peak of live tensors"}
# What a difference of each figure means: the planner counts what it models, the trace measures
# storage, so either the model misses a tensor or the trace holds what a GPU would not.
WHY = {
    "parameter_bytes": "the planner counts the fp32 parameters over the sharding group x tp; the trace measures "
                       "each local shard's storage, with FSDP2's padding to equal shards",
    "gradient_bytes": "the planner counts fp32 gradient shards; the trace measures the reduce-scattered "
                      "buffers the optimizer step finds",
    "optimizer_bytes": "the planner counts the optimizer's moments per parameter shard; the trace measures the "
                       "state the optimizer holds after its step",
    "peak_bytes": "the planner's largest step phase against the traced live tensors; the trace has one stream "
                  "(no prefetched block beside the running one) and CPU attention kernels "
                  "(docs/planner.md, what the trace covers)",
}


def differences(traced: dict, planned: dict) -> list[dict]:
    """The figures whose planned value differs from the traced one by more than FLAG_AT, with why."""
    found = []
    for key in LABELS:
        have, want = traced[key], planned[key]
        share = (want - have) / have if have else (0.0 if not want else float("inf"))
        if abs(share) > FLAG_AT:
            found.append({"figure": key, "planned_vs_traced": round(share, 4), "why": WHY[key]})
    return found


def rank_dict(traced: dict, planned: dict) -> dict:
    """One traced rank as `--json` gives it: the traced figures, the planner's, what differs."""
    return {"rank": traced["rank"], "mesh": traced["mesh"], **{key: traced[key] for key in LABELS},
            "planned_peak_bytes": planned["peak_bytes"],
            "planned": {key: planned[key] for key in LABELS}, "peak_at": traced["peak_at"],
            "collectives": traced["collectives"], "seconds": traced["seconds"],
            "differences": differences(traced, planned)}


def trace_dict(trace: Trace) -> dict:
    """The `trace` object of a configuration's JSON."""
    planned = trace.planned
    out = {"world_size": trace.world_size, "seconds": trace.seconds}
    if trace.traced_as:
        out["traced_as"] = trace.traced_as
    if trace.not_traced:
        return {**out, "not_traced": trace.not_traced}
    return {**out, "ranks": [rank_dict(r, planned) for r in trace.ranks]}


def trace_lines(trace: Trace) -> list[str]:
    """What `plan --trace` prints after the plan."""
    if trace.not_traced:
        return [f"trace: not traced: {trace.not_traced}"]
    lines, planned = [], trace.planned
    for r in trace.ranks:
        mesh = " x ".join(f"{name} {r['mesh'][name]}" for name in ParallelLayout.mesh_dim_names
                          if r["mesh"].get(name, 1) > 1) or "one rank"
        lines.append(f"trace: rank {r['rank']} of {trace.world_size} ({mesh}), one step of the runtime's code on a "
                     f"fake process group in {r['seconds']:.0f} s" + (f"; traced with {trace.traced_as}"
                                                                     if trace.traced_as else ""))
        unit, size = _unit(r["peak_bytes"])
        lines.append(f"  {'':22}{'traced ' + unit:>12}{'planned ' + unit:>13}")
        flagged = {d["figure"]: d for d in differences(r, planned)}
        for key, label in LABELS.items():
            mark = f"  {flagged[key]['planned_vs_traced']:+.0%} !" if key in flagged else ""
            lines.append(f"  {label:22}{r[key] / size:12.2f}{planned[key] / size:13.2f}{mark}")
        at = r["peak_at"]
        lines.append(f"  the traced peak is in the {at['phase']}, in {at['module']}")
        lines += [f"  ! {LABELS[d['figure']]} differs by {d['planned_vs_traced']:+.0%}: {d['why']}"
                  for d in flagged.values()]
        lines.append("  collectives of the step: " + "; ".join(
            f"{c['kind']} over {c['group']} ({c['group_size']} ranks) x{c['count']}, {c['bytes'] / size:.2f} {unit}"
            for c in r["collectives"]))
    return lines


def _unit(peak: int) -> tuple[str, int]:
    """GiB for a real job's figures, MiB or KiB for a tiny model's, whose GiB would all read 0.00."""
    return next((name, size) for name, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
                if peak >= size / 10 or size == 1)
