"""Which setting fixes a predicted OOM: candidate changes, each validated and re-planned; and
`estimate_memory`, the memory estimate of a job with that advice (memory.py knows nothing of it,
so the two modules do not import each other).

A candidate is a list of `--set` overrides. It counts only if the changed job passes the same
validation as `smlaunch validate` (so `context_parallel_degree=3` on 8 GPUs is never advised),
and it is ranked by what the re-plan predicts: fitting changes first, cheapest per token first,
one per setting (the smallest context_parallel_degree that fits, not every one).
"""

from __future__ import annotations

import math

from launcher.config import ConfigError, ValidatedJob, validate_job
from launcher.config.jobfile import apply_overrides
from launcher.plan import memory, throughput
from launcher.plan.workload import PlanError, Workload, workload_of
from launcher.wire.training.layout import divisors


def raw_job(job: ValidatedJob) -> dict:
    """The job as the mapping validate_job takes, hyperparameters exactly as written."""
    raw = job.config.model_dump(exclude_unset=True)
    raw["hyperparameters"] = job.config.hyperparameters.raw()
    return raw


def revalidate(job: ValidatedJob, overrides: tuple[str, ...]) -> ValidatedJob:
    """`job` with `--set` overrides applied, validated again (ConfigError if invalid)."""
    raw = raw_job(job)
    apply_overrides(raw, overrides)
    return validate_job(raw, base_dir=job.base_dir, model=type(job.config))


def candidates(w: Workload) -> list[tuple[str, ...]]:
    """Changes that lower some memory term, in order of preference at equal cost."""
    lay = w.layout
    ranks = lay.world // lay.tp  # what the sharding group and cp can span
    out: list[tuple[str, ...]] = []
    for cp in divisors(ranks):
        if cp <= lay.cp:
            continue
        if lay.sharding_group % cp == 0:
            out.append((f"context_parallel_degree={cp}",))
        else:  # cp ranks sit inside the sharding group: widen it to the next multiple of cp
            group = next(g for g in divisors(ranks) if g >= lay.sharding_group and g % cp == 0)
            out.append((f"context_parallel_degree={cp}", f"hybrid_shard_degree={group}"))
    every_block = ("hyperparameters.activation_checkpointing_freq=1",) if w.ac_freq > 1 else ()
    if w.ac_mode is None:
        out.append(("hyperparameters.activation_checkpointing=1",))
    elif w.ac_mode != "full" or every_block:
        out.append(("hyperparameters.activation_checkpointing_mode=full",) + every_block)
    if w.ac_mode is not None and not w.offload:  # offload needs every block checkpointed (speed_rules)
        out.append(("hyperparameters.offload_activations=1",) + every_block)
    if lay.sharding_group < ranks:
        out.append(("hybrid_shard_degree=0",))
    for tp in divisors(w.processes_per_host):
        if tp > lay.tp:  # a group wider than world / tp no longer exists: shard over all of it
            wide = lay.sharding_group > lay.world // tp
            out.append((f"tensor_parallel_degree={tp}",) + (("hybrid_shard_degree=0",) if wide else ()))
    batch = w.micro_batch
    while batch > 1 and batch % 2 == 0:
        batch //= 2
        accum = w.grad_accum * (w.micro_batch // batch)  # same tokens per step
        out.append((f"hyperparameters.train_batch_size={batch}",
                    f"hyperparameters.gradient_accumulation_steps={accum}"))
    if w.optimizer == "adamw":
        out.append(("hyperparameters.optimizer=anyprecision",))
    if not w.reshard_after_forward:
        out.append(("hyperparameters.sharding_strategy=full_shard",))
    if not w.delayed_init:
        out.append(("hyperparameters.delayed_param=1",))
    return out


def estimate_memory(job: ValidatedJob, advise: bool = True) -> memory.MemoryEstimate:
    """Memory per accelerator of a validated job. When it predicts OOM and `advise` is set,
    `advice` lists the settings that fix it, each re-validated and re-planned (`fixes`).
    Raises PlanError when the model or the world size is unknown."""
    estimate = memory.estimate_workload(workload_of(job))
    if advise and estimate.oom:
        estimate.advice = fixes(job, estimate)
    return estimate


def fixes(job: ValidatedJob, estimate: memory.MemoryEstimate, limit: int = 4) -> list[memory.Fix]:
    """Up to `limit` fixes: those predicted to fit, else those that lower the peak most."""
    found: list[memory.Fix] = []
    for overrides in candidates(workload_of(job)):
        try:
            w = workload_of(revalidate(job, overrides))
        except (ConfigError, PlanError):
            continue
        est = memory.estimate_workload(w)
        if est.peak_gib >= estimate.peak_gib:
            continue
        speed = throughput.estimate_workload(w)
        found.append(memory.Fix(overrides, est.peak_gib, est.fits,
                                speed.usd_per_billion_tokens if speed else None))
    fitting = [f for f in found if f.fits is not False]
    if fitting:
        ranked = sorted(fitting, key=lambda f: math.inf if f.usd_per_billion_tokens is None
                        else f.usd_per_billion_tokens)
    else:
        ranked = sorted(found, key=lambda f: f.peak_gib)
    seen, out = set(), []
    for fix in ranked:  # sorted() is stable: at equal cost the preferred (smaller) change wins
        knob = fix.overrides[0].split("=", 1)[0]
        if knob not in seen:
            seen.add(knob)
            out.append(fix)
    return out[:limit]
