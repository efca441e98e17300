"""`plan --auto`'s search: instance types and counts, and on each fleet the layouts (tp, cp,
hsd, pp), micro batches and activation checkpointing that keep the job's global batch; the
configurations that fit, reduced to their Pareto front of time against dollars.

Every configuration is a list of `--set` overrides planned by sweep.plan_overrides, so the
validation rules decide what is valid; the arithmetic here only avoids planning layouts that
cannot tile the world or keep the batch. The search stays small by construction:

- tp within a host (divisors of its GPUs), cp over what is left, hsd either a host's shard
  group or every rank of a stage, pp in {1, 2, 4} only where the job allows pipelining at all
  (the first pipelined candidate's validation errors say why not, and the rest are skipped);
- per layout, micro batches smallest first, so the first one that does not fit ends the line
  (memory only grows with it), and a layout whose first configuration is invalid is left at that;
- checkpointing off first: at a micro batch where it fits, checkpointing on runs the same job
  slower at the same hourly price, so it is planned only where off does not fit.

The front is over hours and dollars for `--tokens` (per billion tokens without it); the global
batch is the job's, so step time orders configurations as tokens/s does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config import Issue, ValidatedJob, validate_job
from launcher.config.job import JobFile
from launcher.config.jobfile import load_job_file
from launcher.plan.configurations import plan_overrides, settings_of
from launcher.plan.report import PlanResult
from launcher.plan.workload import modeled_program, workload_of
from launcher.wire.training.base import MAX_INSTANCE_COUNT
from launcher.wire.training.catalog import InstanceType, catalog_names, get_instance_type
from launcher.wire.training.degrees import by_short
from launcher.wire.training.issues import did_you_mean
from launcher.wire.training.layout import divisors

DEFAULT_MAX_INSTANCES = 4  # counts 1, 2, 4 unless --max-instances or --deadline says otherwise
DEADLINE_MAX_INSTANCES = 64  # how far counts double looking for one that meets --deadline
PIPELINE_DEGREES = (2, 4)
PER_BILLION = 1e9  # hours and dollars are per billion tokens unless --tokens is given
_UNITS_H = {"s": 1 / 3600, "m": 1 / 60, "h": 1.0, "d": 24.0}


class SearchOptionError(ValueError):
    """A search option that cannot be used; each issue names the option, the value and the fix."""

    def __init__(self, issues: list[Issue]):
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues))


@dataclass(frozen=True)
class Skip:
    """Part of the space not searched, and why (instance_type/instance_count None: all of them)."""

    reason: str
    instance_type: str | None = None
    instance_count: int | None = None

    def to_dict(self) -> dict:
        return {"instance_type": self.instance_type, "instance_count": self.instance_count, "reason": self.reason}


@dataclass
class SearchResult:
    results: list[PlanResult]  # every configuration planned, valid or not
    skipped: list[Skip]
    instance_types: list[str]  # searched
    instance_counts: list[int]  # searched, over all types
    tokens: float  # what hours and dollars are for
    deadline_h: float | None
    base: dict[str, Any] = field(default_factory=dict)  # the job's own settings (sweep.settings_of)
    front: list[PlanResult] = field(default_factory=list)  # Pareto front, cheapest first
    fastest_fitting: PlanResult | None = None  # over every fitting configuration, deadline or not
    models: str | None = None  # what the plans model (launcher.plan.workload.modeled_program)
    uncalibrated: dict[str, str] = field(default_factory=dict)  # instance type -> what its speed is borrowed from

    @property
    def cheapest(self) -> PlanResult | None:
        return self.front[0] if self.front else None

    @property
    def fastest(self) -> PlanResult | None:
        return self.front[-1] if self.front else None

    def hours_usd(self, result: PlanResult) -> tuple[float, float | None]:
        return result.throughput.cost_for(tokens=self.tokens)


def search_job_file(path: str | Path, overrides: Iterable[str] = (), *, instance_types: str | None = None,
                    families: str | None = None, max_instances: int | None = None, tokens: float | None = None,
                    deadline: str | None = None) -> SearchResult:
    """Search the job file's space (see the module docstring). Raises SearchOptionError for a
    bad option, ConfigError for an invalid job, PlanError for one that cannot be planned."""
    deadline_h = parse_options(instance_types, families, max_instances, tokens, deadline)
    data, base = load_job_file(path, overrides)
    job = validate_job(data, base_dir=base, source=str(path), model=JobFile)
    workload_of(job)  # PlanError when the job cannot be planned at all (unknown model or world)
    types, skipped = candidate_types(job, instance_types, families)
    return search(job, data, types, skipped, base_dir=base, source=str(path), max_instances=max_instances,
                  tokens=tokens, deadline_h=deadline_h)


def parse_options(instance_types: str | None, families: str | None, max_instances: int | None,
                  tokens: float | None, deadline: str | None) -> float | None:
    """Check the search options together; the deadline in hours (None without one)."""
    issues = []
    if instance_types is not None and families is not None:
        issues.append(Issue("--family", families, "is given with --instance-types", "give only one of them"))
    if max_instances is not None and not 1 <= max_instances <= MAX_INSTANCE_COUNT:
        issues.append(Issue("--max-instances", max_instances, f"must be between 1 and {MAX_INSTANCE_COUNT}",
                            "e.g. --max-instances 8"))
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        issues.append(Issue("--tokens", tokens, "must be a positive number of tokens", "e.g. --tokens 1e10"))
    deadline_h = None
    if deadline is not None:
        deadline_h = parse_deadline(deadline, issues)
        if tokens is None:
            issues.append(Issue("--deadline", deadline, "needs the number of tokens to train",
                                "add --tokens, e.g. --tokens 1e10 --deadline 48h"))
    if issues:
        raise SearchOptionError(issues)
    return deadline_h


def parse_deadline(text: str, issues: list[Issue]) -> float | None:
    """'48h', '2d', '90m', '3600s', '1.5h' -> hours; appends an issue for anything else."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd])\s*", text.lower())
    hours = float(found.group(1)) * _UNITS_H[found.group(2)] if found else 0.0
    if hours > 0 and math.isfinite(hours):
        return hours
    issues.append(Issue("--deadline", text, "is not a positive duration with a unit",
                        "e.g. --deadline 48h (units: s, m, h, d)"))
    return None


def candidate_types(job: ValidatedJob, instance_types: str | None,
                    families: str | None) -> tuple[list[InstanceType], list[Skip]]:
    """The instance types to search: those named, those of the named families, or by default
    the job's own and every priced 8-GPU NVIDIA type with bf16 tensor cores. A type that cannot
    run the job as set (FP8 without FP8 tensor cores) or has no price to rank is skipped, saying so."""
    if instance_types is not None:
        named = _names(instance_types, "--instance-types")
        found = {n: get_instance_type(n) for n in named}
        bad = [n for n, t in found.items() if t is None or not t.accelerators]
        if bad:
            gpu_types = [n for n in catalog_names() if (get_instance_type(n).accelerators or 0) > 0]
            raise SearchOptionError([Issue("--instance-types", n, "is not an accelerated SageMaker instance type "
                                     "in the catalog",
                                     did_you_mean(n, gpu_types) or "see launcher/wire/training/catalog.py")
                               for n in bad])
        pool = list(dict.fromkeys(found.values()))
    elif families is not None:
        by_family: dict[str, list[InstanceType]] = {}
        for name in catalog_names():
            t = get_instance_type(name)
            if t.accelerators:
                by_family.setdefault(t.family, []).append(t)
        wanted = _names(families, "--family")
        unknown = [f for f in wanted if f.lower().removeprefix("ml.") not in by_family]
        if unknown:
            raise SearchOptionError([Issue("--family", f, "is not an accelerated instance family in the catalog",
                                           did_you_mean(f, by_family) or f"families: {', '.join(sorted(by_family))}")
                                     for f in unknown])
        pool = [t for f in wanted for t in by_family[f.lower().removeprefix("ml.")]]
    else:
        pool = [job.instance] if job.instance is not None and job.instance.accelerators else []
        pool += [get_instance_type(n) for n in catalog_names() if _default_type(get_instance_type(n))]
        pool = list(dict.fromkeys(pool))
    return _runnable(job, pool)


def _default_type(t: InstanceType) -> bool:
    acc = t.accelerator
    return (t.accelerators == 8 and acc is not None and acc.vendor == "nvidia" and acc.bf16_tflops is not None
            and t.usd_per_hour is not None)


def _runnable(job: ValidatedJob, pool: list[InstanceType]) -> tuple[list[InstanceType], list[Skip]]:
    types, skipped = [], []
    for t in pool:
        if job.fp8.enabled and not t.has_fp8:
            skipped.append(Skip(f"{t.accelerator.model} has no FP8 tensor cores and the job sets fp8 "
                                "(add --set hyperparameters.fp8=0 to search it in bf16)", t.name))
        elif t.usd_per_hour is None:
            skipped.append(Skip("the catalog has no on-demand price for it, so its cost cannot be ranked", t.name))
        else:
            types.append(t)
    return types, skipped


def _names(text: str, option: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise SearchOptionError([Issue(option, text, "names nothing", "give a comma-separated list, e.g. p4d,p5")])
    return list(dict.fromkeys(names))


def search(job: ValidatedJob, data: dict, types: list[InstanceType], skipped: list[Skip], *,
           base_dir: Path, source: str | None, max_instances: int | None, tokens: float | None,
           deadline_h: float | None) -> SearchResult:
    """Plan the space of `types` (see the module docstring) and find its Pareto front."""
    out = SearchResult([], list(skipped), [t.name for t in types], [], tokens or PER_BILLION, deadline_h,
                       base=settings_of(job), models=modeled_program(job))
    cap = max_instances or (DEADLINE_MAX_INSTANCES if deadline_h is not None else DEFAULT_MAX_INSTANCES)
    counts = sorted({2**i for i in range(cap.bit_length()) if 2**i <= cap} | {cap}
                    | ({job.config.instance_count} if job.config.instance_count <= cap else set()))
    batch = global_batch(job)
    pipeline = _Pipeline()
    for t in types:
        for count in counts:
            found = _search_fleet(job, data, t, count, batch, pipeline, out, base_dir, source)
            if count not in out.instance_counts:
                out.instance_counts.append(count)
            if deadline_h is not None and max_instances is None and any(
                    r.fits and r.throughput and out.hours_usd(r)[0] <= deadline_h for r in found):
                break  # the smallest fleet of this type that meets it; --max-instances searches further
        _speed_notes(t, [r for r in out.results if r.valid and r.settings.get("instance_type") == t.name], out)
    if pipeline.refused:
        out.skipped.append(Skip(f"pipeline parallelism: {pipeline.refused}"))
    out.instance_counts.sort()
    rankable = [r for r in out.results if r.fits and r.throughput is not None and r.usd_per_billion_tokens is not None]
    out.fastest_fitting = min(rankable, key=lambda r: (out.hours_usd(r)[0], _tie_break(r)), default=None)
    if deadline_h is not None:
        rankable = [r for r in rankable if out.hours_usd(r)[0] <= deadline_h]
    out.front = pareto(rankable, out.tokens)
    return out


def _speed_notes(t: InstanceType, planned: list[PlanResult], out: SearchResult) -> None:
    """A type whose configurations have no speed is skipped, saying why; one whose speed rests on
    another GPU's calibration is named as uncalibrated."""
    if planned and not any(r.tokens_per_s for r in planned):
        why = next((r.no_throughput for r in planned if r.no_throughput), "no estimate")
        out.skipped.append(Skip(f"the planner has no speed for it ({why}), so it cannot be ranked", t.name))
    borrowed = next((r.throughput.borrowed for r in planned if r.throughput and r.throughput.borrowed), None)
    if borrowed:
        out.uncalibrated[t.name] = borrowed


def global_batch(job: ValidatedJob) -> int:
    """Sequences per optimizer step: train_batch_size x gradient_accumulation_steps x data parallel."""
    s = job.settings
    return s.micro_batch * s.grad_accum * job.layout.data_parallel


@dataclass
class _Pipeline:
    """Whether pipelining is still tried: the first pipelined candidate's errors end it."""

    tried: bool = False
    refused: str | None = None


def _search_fleet(job: ValidatedJob, data: dict, t: InstanceType, count: int, batch: int, pipeline: _Pipeline,
                  out: SearchResult, base_dir: Path, source: str | None) -> list[PlanResult]:
    """Plan every layout of `count` x `t` that keeps the global batch of `batch` sequences."""
    per_host = job.config.processes_per_host or t.accelerators
    layouts = list(fleet_layouts(per_host, count, batch, job.model.num_layers if job.model else None,
                                 pipeline=pipeline.refused is None))
    if not layouts:
        out.skipped.append(Skip(f"no layout of {count * per_host} GPUs keeps the global batch of {batch} "
                                f"sequences (its data-parallel degree must divide {batch})", t.name, count))
        return []
    found: list[PlanResult] = []
    for layout in layouts:
        pp = layout["pipeline_parallel_degree"]
        if pp > 1 and pipeline.refused:
            continue
        fixed = (f"instance_type={t.name}", f"instance_count={count}", *(f"{k}={v}" for k, v in layout.items()))
        per_rank = batch * math.prod(layout[k] for k in ("tensor_parallel_degree", "context_parallel_degree",
                                                           "pipeline_parallel_degree")) // (count * per_host)
        if pp > 1:
            fixed += (f"microbatches={per_rank}",)
        plan_one = _planner(data, fixed, per_rank, out, base_dir, source)
        micros = _micro_batches(per_rank, pp)
        # Checkpointing off first: where it fits, checkpointing on at that micro batch is slower at
        # the same price (dominated), so it is only planned where off does not fit.
        off = _line(plan_one, micros, ac=0)
        if pp > 1 and not pipeline.tried and any(r.valid for r in found):
            # refused where the same fleet runs unpipelined: the job's reason, not the layout's
            pipeline.tried = True
            pipeline.refused = None if off[0].valid else off[0].errors[0]
        found += off
        if not off[0].valid:
            continue  # the layout itself is invalid
        fitting = sum(r.fits is not False for r in off if r.valid)
        found += _line(plan_one, micros[fitting:], ac=1)
    if not any(r.valid for r in found):
        out.skipped.append(Skip(f"no configuration is valid, e.g. {found[0].errors[0]}", t.name, count))
    return found


def _planner(data: dict, fixed: tuple[str, ...], per_rank: int, out: SearchResult, base_dir: Path,
             source: str | None):
    def plan_one(micro: int, ac: int) -> PlanResult:
        sets = fixed + (f"hyperparameters.train_batch_size={micro}",
                        f"hyperparameters.gradient_accumulation_steps={per_rank // micro}",
                        f"hyperparameters.activation_checkpointing={ac}")
        result = plan_overrides(data, sets, base_dir=base_dir, source=source)
        out.results.append(result)
        return result
    return plan_one


def _line(plan_one, micros: list[int], ac: int) -> list[PlanResult]:
    """Plan micro batches smallest first until one is invalid or does not fit: a larger one needs
    more memory."""
    line = []
    for micro in micros:
        line.append(plan_one(micro, ac))
        if not line[-1].valid or line[-1].fits is False:
            break
    return line


def fleet_layouts(gpus: int, count: int, batch: int, num_layers: int | None, *,
                  pipeline: bool = True) -> Iterator[dict[str, int]]:
    """(tp, cp, hsd, pp) that tile `count` hosts of `gpus` GPUs with a data-parallel degree that
    divides the global batch: tp within a host, hsd a host's shard group or a whole stage."""
    world = gpus * count
    for pp in (1, *(PIPELINE_DEGREES if pipeline else ())):
        if world % pp or (num_layers is not None and num_layers % pp):
            continue
        stage = world // pp
        for tp in divisors(gpus):
            if stage % tp:
                continue
            for cp in divisors(stage // tp):
                dp = stage // (tp * cp)
                per_rank = batch // dp if batch % dp == 0 else 0
                if not per_rank or per_rank < pp:
                    continue
                groups = {stage // tp} | ({gpus // tp} if count > 1 else set())
                for hsd in sorted(groups, reverse=True):
                    if hsd % cp == 0 and (stage // tp) % hsd == 0:
                        yield by_short(tp=tp, cp=cp, hsd=hsd, pp=pp)


def _micro_batches(per_rank: int, pp: int) -> list[int]:
    """Micro batches for a rank's `per_rank` sequences: its divisors, or (pipelined) all of them
    at once, cut into `microbatches` by the schedule instead."""
    return [per_rank] if pp > 1 else divisors(per_rank)


def pareto(results: Iterable[PlanResult], tokens: float) -> list[PlanResult]:
    """The configurations no other is at least as fast and as cheap as (and strictly one of the
    two), cheapest first; of equal ones, the simplest layout with the lowest peak."""
    def key(r: PlanResult):
        hours, usd = r.throughput.cost_for(tokens=tokens)
        return (_round(usd), _round(hours), _tie_break(r))

    front: list[PlanResult] = []
    for r in sorted(results, key=key):
        hours = _round(r.throughput.cost_for(tokens=tokens)[0])
        if not front or hours < _round(front[-1].throughput.cost_for(tokens=tokens)[0]):
            front.append(r)
    return front


def _tie_break(r: PlanResult) -> tuple:
    s = r.settings
    degrees = [s.get(k) or 1 for k in ("tensor_parallel_degree", "context_parallel_degree")]
    return (math.prod(degrees), s.get("instance_count") or 1, r.memory.peak_gib if r.memory else math.inf)


def _round(x: float) -> float:
    """Equal to 9 significant digits counts as equal: the same cost computed two ways."""
    return float(f"{x:.9g}")


def set_lines(result: PlanResult, base: dict[str, Any]) -> list[str]:
    """The `--set` overrides that turn the job (whose settings are `base`) into this
    configuration: those that change something."""
    lines = []
    for override in result.overrides:
        key, _, value = override.partition("=")
        name = key.rsplit(".", 1)[-1]
        old = base.get(name)
        if name == "activation_checkpointing":
            old = int(bool(old))
        if old is None or str(old) != value:
            lines.append(override)
    return lines

