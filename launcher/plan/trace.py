"""`smlaunch plan --trace`: the runtime's own code traced at the job's whole world, beside the plan.

Each traced rank (rank 0; the first rank of the last pipeline stage when pp > 1) needs a process of
its own (the fake process group, the meshes and what context parallelism installs are process-wide)
and `launcher/` never imports torch: one `python -m container trace` (container/trace/) takes the
ranks of a job, or of several jobs (`trace_jobs`: a benchmark's grid), imports the runtime once and
forks a process per rank. The requests and the results are launcher.wire.trace_record's. What the
trace does not cover: docs/planner.md.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from dataclasses import dataclass, field

from launcher.config import ValidatedJob, validate_job
from launcher.plan.advice import estimate_memory
from launcher.plan.memory import MemoryEstimate
from launcher.wire.trace_record import COMMAND, TraceRequest, read_results, spec_to_dict
from launcher.wire.training.layout import ParallelLayout

INSTALL = "pip install 'smlaunch[train]'"  # what puts torch and the runtime beside the client


class TraceError(RuntimeError):
    """The trace could not run, or a rank's layout could not be built (the message says where)."""


@dataclass
class Trace:
    """The traced ranks' results (launcher.wire.trace_record), or why the job's step is not traced."""

    world_size: int
    seconds: float
    ranks: list[dict] = field(default_factory=list)
    not_traced: str | None = None
    traced_as: str | None = None  # a setting the trace runs otherwise than a GPU would, and why
    planned: dict[str, int] = field(default_factory=dict)  # the planner's figures of the job as traced


def traced_ranks(layout: ParallelLayout) -> list[int]:
    """Rank 0, and the first rank of the last pipeline stage (pp is the mesh's outermost dimension)."""
    last_stage = (layout.pp - 1) * (layout.world // layout.pp)
    return [0] if last_stage == 0 else [0, last_stage]


def as_traced(job: ValidatedJob) -> tuple[ValidatedJob, str | None]:
    """The job as the trace runs it on CPU, and what differs: without Transformer Engine (CUDA only)
    context parallelism all-gathers K/V, so the planner is asked about that path."""
    if job.layout.cp == 1 or job.settings.cp_comm_type == "all_gather":
        return job, None
    raw = job.config.model_dump(exclude_unset=True)
    raw.setdefault("hyperparameters", {})["cp_comm_type"] = "all_gather"
    changed = validate_job(raw, base_dir=job.base_dir, model=type(job.config))
    changed.files = job.files
    return changed, ("cp_comm_type all_gather: without Transformer Engine (CUDA only) context parallelism "
                     "all-gathers K/V")


def request(job: ValidatedJob, rank: int) -> TraceRequest:
    dist = job.config.distribution
    return TraceRequest(
        rank=rank, world_size=job.layout.world, processes_per_host=job.processes_per_host,
        hyperparameters=job.config.hyperparameters.model_dump(mode="json", exclude_unset=True),
        mp_parameters=dist.parameters.model_dump(mode="json", exclude_unset=True) if dist else {},
        model=spec_to_dict(job.model))


def check_runtime() -> None:
    """The runtime and torch are importable here, else a TraceError naming what to install."""
    missing = [name for name in ("torch", "container") if importlib.util.find_spec(name) is None]
    if missing:
        raise TraceError(f"--trace runs smlaunch's training runtime, which needs {' and '.join(missing)} in this "
                         f"Python ({sys.executable}): {INSTALL}, or run plan without --trace")


def run_trace(job: ValidatedJob) -> Trace:
    """Trace each rank role of `job` (validated, with a model and a world size) at its whole world."""
    (trace,) = trace_jobs([job])
    if isinstance(trace, TraceError):
        raise trace
    return trace


def trace_jobs(jobs: list[ValidatedJob]) -> list[Trace | TraceError]:
    """Each job's trace, or the TraceError saying where it failed, from one `python -m container trace`
    (the runtime imported once for all of them); a Trace's seconds are the whole batch's."""
    check_runtime()
    started = time.perf_counter()
    traced = [as_traced(job) for job in jobs]
    requests = [[request(job, rank) for rank in traced_ranks(job.layout)] for job, _ in traced]
    results = iter(trace_requests([r for rs in requests for r in rs]))
    seconds = round(time.perf_counter() - started, 1)
    return [_trace(job, traced_as, [next(results) for _ in rs], seconds)
            for (job, traced_as), rs in zip(traced, requests)]


def _trace(job: ValidatedJob, traced_as: str | None, results: list, seconds: float) -> Trace | TraceError:
    failed = next((r for r in results if isinstance(r, TraceError)), None)
    if failed is not None:
        return failed
    trace = Trace(world_size=job.layout.world, seconds=seconds, traced_as=traced_as,
                  planned=planned_figures(estimate_memory(job, advise=False)))
    untraced = next((r["not_traced"] for r in results if "not_traced" in r), None)
    if untraced:
        trace.not_traced = untraced
    else:
        trace.ranks = results
    return trace


def trace_requests(requests: list[TraceRequest]) -> list[dict | TraceError]:
    """Each request's result from one `python -m container trace`, or a TraceError saying where it failed."""
    proc = subprocess.run([sys.executable, *COMMAND], input="".join(r.to_json() + "\n" for r in requests),
                          capture_output=True, text=True, check=False)
    results = read_results(proc.stdout)
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if len(results) != len(requests):  # the process failed before it answered (an import, a crash)
        results = [{"rank": r.rank, "exit": proc.returncode or 1} for r in requests]
    return [_checked(req, result, tail) for req, result in zip(requests, results)]


def _checked(req: TraceRequest, result: dict, tail: str) -> dict | TraceError:
    if "error" in result:
        return TraceError(result["error"])
    if "exit" in result:
        return TraceError(f"the trace of rank {req.rank} of {req.world_size} failed (exit {result['exit']}): {tail}")
    return result


def planned_figures(estimate: MemoryEstimate) -> dict[str, int]:
    """The planner's bytes for what a trace measures: the held terms, and the largest step phase's
    live tensors (its "init" phase, model construction, is no training step and is not traced)."""
    step = {phase: gib for phase, gib in estimate.phases.items() if phase != "init"}
    return {"parameter_bytes": round((estimate.gib("parameters") + estimate.gib("nf4_base")) * 2**30),
            "gradient_bytes": round(estimate.gib("gradients") * 2**30),
            "optimizer_bytes": round(estimate.gib("optimizer") * 2**30),
            "peak_bytes": round(max(step.values()) * 2**30)}
