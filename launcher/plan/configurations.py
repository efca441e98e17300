"""plan(): memory and throughput of one job; sweep(): of every combination of settings; auto():
the cheapest combination that fits.

A sweep works on the job file's data (extends resolved, --set applied) and applies each
combination as `--set` overrides, so a sweep key is anything --set takes: a bare model-parallel
key (`context_parallel_degree`), or a dotted path (`hyperparameters.activation_checkpointing`).
Every combination is validated like `smlaunch validate`; one that fails is reported with its
errors, not raised.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher.config import ConfigError, Issue, ValidatedJob, validate_job
from launcher.config.job import JobFile
from launcher.config.jobfile import MP_PATH, apply_overrides, load_job_file
from launcher.plan.advice import estimate_memory
from launcher.plan.host_staging import host_staging
from launcher.plan.report import PlanResult
from launcher.plan.throughput import estimate_or_reason
from launcher.plan.workload import PlanError, UnmodeledScript, workload_of
from launcher.wire.training import degrees
from launcher.wire.training.layout import divisors
from launcher.wire.training.run_settings import DEFAULT_AC_MODE, DEFAULT_SEQ_LEN, run_settings

# A local job planned as the job it will become: the figures are the instance type's whichever backend
# runs it, and Slurm's hosts read this machine's paths, so its local inputs and output_path stay valid
# (SageMaker would refuse them until they are s3:// URIs).
PLAN_LOCAL_AS = {"instance_type": "ml.p5.48xlarge", "backend": "slurm"}
LOCAL_JOB = ("a local job runs on this machine (its CPU, or for local_gpu the GPUs found when it starts), whose "
             "memory and speed the planner has no figures for: plan it as the job it will be, e.g. "
             + " ".join(f"--set {k}={v}" for k, v in PLAN_LOCAL_AS.items())
             + " (Slurm takes the job's local paths as they are; the figures are the instance type's wherever it "
             "runs), or PyTorch(..., " + ", ".join(f'{k}="{v}"' for k, v in PLAN_LOCAL_AS.items()) + ").plan()")


def plan(job: ValidatedJob, overrides: Sequence[str] = (), advise: bool = True) -> PlanResult:
    """Memory (with advice when it predicts OOM) and throughput of a validated job."""
    settings = settings_of(job)
    if job.config.is_local:
        return PlanResult(settings, tuple(overrides), job=job, nothing_to_plan=LOCAL_JOB)
    try:
        memory = estimate_memory(job, advise=advise)
        speed = estimate_or_reason(workload_of(job))
    except UnmodeledScript as exc:
        return PlanResult(settings, tuple(overrides), job=job, nothing_to_plan=str(exc))
    except PlanError as exc:
        return PlanResult(settings, tuple(overrides), errors=[str(exc)], job=job)
    gap = speed if isinstance(speed, str) else None
    return PlanResult(settings, tuple(overrides), memory, None if gap else speed, job=job,
                      staging=host_staging(job, memory), no_throughput=gap)


def settings_of(job: ValidatedJob) -> dict[str, Any]:
    """The settings that tell one swept configuration from another."""
    cfg = job.config
    p = cfg.distribution.parameters if cfg.distribution else None
    run = run_settings(cfg.hyperparameters, p, job.layout.world if job.layout else 1)
    return {
        "instance_type": job.instance.name if job.instance else cfg.instance_type,
        "instance_count": cfg.instance_count,
        **degrees.settings(p),
        # SMP v1's sharding group, in force where it is set (launcher.wire.training.layout.sharding_group)
        "sharded_data_parallel_degree": p.sharded_data_parallel_degree if p else None,
        "sharding_group": job.layout.sharding_group if job.layout else None,
        "activation_checkpointing": run.ac_mode or False,
        "offload_activations": run.offload,
        "fp8": job.fp8.enabled,
        "train_batch_size": run.micro_batch,
        "gradient_accumulation_steps": run.grad_accum,
        "max_context_width": run.seq_len,
        "model": job.model.name if job.model else None,
    }


def parse_sweeps(specs: Iterable[str]) -> dict[str, list[str]]:
    """`--sweep KEY=V1,V2,...` options -> {KEY: [V1, V2, ...]} (values stay text, read as YAML
    when applied, like --set values). A repeated key is an error."""
    out: dict[str, list[str]] = {}
    issues = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key or not items:
            issues.append(Issue("--sweep", spec, "expected KEY=V1,V2,...",
                                "e.g. --sweep context_parallel_degree=1,2,4,8"))
        elif key in out:
            issues.append(Issue("--sweep", spec, f"{key} is swept twice", "give all its values in one --sweep"))
        else:
            out[key] = items
    if issues:
        raise ConfigError(issues)
    return out


def sweep(data: Mapping[str, Any], sweeps: Mapping[str, Sequence[Any]], *, base_dir: str | Path,
          source: str | None = None, advise: bool = False) -> list[PlanResult]:
    """Plan every combination of `sweeps` applied to the job data; with no sweeps, the job itself."""
    keys = list(sweeps)
    return [plan_overrides(data, tuple(f"{k}={_text(v)}" for k, v in zip(keys, combo)), base_dir=base_dir,
                           source=source, advise=advise)
            for combo in itertools.product(*(sweeps[k] for k in keys))]


def plan_overrides(data: Mapping[str, Any], overrides: Sequence[str], *, base_dir: str | Path,
                   source: str | None = None, advise: bool = False) -> PlanResult:
    """Plan the job data with `overrides` applied, validated like `smlaunch validate`; a
    configuration that fails validation comes back with its errors, not raised."""
    overrides = tuple(overrides)
    raw = copy.deepcopy(dict(data))
    try:
        apply_overrides(raw, overrides)
        job = validate_job(raw, base_dir=base_dir, source=source, model=JobFile)
    except ConfigError as exc:
        return PlanResult(_raw_settings(raw), overrides, errors=[str(i) for i in exc.issues])
    return plan(job, overrides, advise=advise)


def sweep_job_file(path: str | Path, overrides: Iterable[str] = (),
                   sweeps: Mapping[str, Sequence[Any]] | Iterable[str] = ()) -> list[PlanResult]:
    """sweep() over a job file; `sweeps` as a mapping or as `--sweep` option strings. Raises
    ConfigError when the file itself cannot be read or an override/sweep option is malformed."""
    data, base = load_job_file(path, overrides)
    if not isinstance(sweeps, Mapping):
        sweeps = parse_sweeps(sweeps)
    return sweep(data, sweeps, base_dir=base, source=str(path))


def default_space(job: ValidatedJob) -> dict[str, list[Any]]:
    """What auto_job_file() searches when nothing is swept, on the job's own fleet:
    context_parallel_degree and hybrid_shard_degree over the divisors of the processes per host
    (and 0, all ranks, across hosts), activation checkpointing on and off; the job's own values
    are always included. (`plan --auto` searches fleets too: launcher/plan/search.py.)"""
    pph = job.processes_per_host or 1
    settings = settings_of(job)
    per_host = divisors(pph)
    cps = sorted(set(per_host) | {settings["context_parallel_degree"]})
    hsds = set(per_host) | {settings["hybrid_shard_degree"] or 1}  # on one host 0 means pph: listed
    if job.config.instance_count > 1:
        hsds.add(0)
    return {
        "context_parallel_degree": cps,
        "hybrid_shard_degree": sorted(hsds),
        "hyperparameters.activation_checkpointing": [1, 0],
    }


def auto(results: Iterable[PlanResult]) -> PlanResult | None:
    """The cheapest configuration that fits: lowest $ per billion tokens, then highest tokens/s;
    at equal cost the smaller cp and tp (communication the model does not price), then the
    lower peak. Where no capacity is known (local runs), valid configurations compete instead."""
    valid = [r for r in results if r.valid and r.memory is not None]
    pool = [r for r in valid if r.fits] or [r for r in valid if r.fits is None]
    if not pool:
        return None

    def key(r: PlanResult):
        usd = r.usd_per_billion_tokens
        return (usd is None, usd if usd is not None else 0.0, -(r.tokens_per_s or 0.0),
                r.settings.get("context_parallel_degree", 1), r.settings.get("tensor_parallel_degree", 1),
                r.memory.peak_gib if r.memory else math.inf)

    return min(pool, key=key)


def auto_job_file(path: str | Path, overrides: Iterable[str] = (),
                  sweeps: Mapping[str, Sequence[Any]] | Iterable[str] = ()
                  ) -> tuple[PlanResult | None, list[PlanResult]]:
    """(the cheapest fitting configuration, every configuration tried). Without sweeps the
    search space is default_space() of the job file as given (which must then be valid)."""
    data, base = load_job_file(path, overrides)
    if not isinstance(sweeps, Mapping):
        sweeps = parse_sweeps(sweeps)
    if not sweeps:
        job = validate_job(data, base_dir=base, source=str(path), model=JobFile)
        sweeps = default_space(job)
    results = sweep(data, sweeps, base_dir=base, source=str(path))
    return auto(results), results


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _raw_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """Best-effort settings of a configuration that did not validate."""
    node: Any = data.get("distribution")
    for part in MP_PATH[1:]:
        node = node.get(part) if isinstance(node, dict) else None
    mp = node if isinstance(node, dict) else {}
    hp = data.get("hyperparameters") if isinstance(data.get("hyperparameters"), dict) else {}
    ac = hp.get("activation_checkpointing") not in (None, 0, False, "0", "false", "False")
    return {
        "instance_type": data.get("instance_type"),
        "instance_count": data.get("instance_count", 1),
        **{d.key: d.raw_value(mp) for d in degrees.DEGREES},
        "sharded_data_parallel_degree": mp.get("sharded_data_parallel_degree"),
        "sharding_group": None,
        "activation_checkpointing": (hp.get("activation_checkpointing_mode") or DEFAULT_AC_MODE) if ac else False,
        "offload_activations": bool(hp.get("offload_activations")),
        "fp8": bool(hp.get("fp8")),
        "train_batch_size": hp.get("train_batch_size", 1),
        "gradient_accumulation_steps": hp.get("gradient_accumulation_steps", 1),
        "max_context_width": hp.get("max_context_width", DEFAULT_SEQ_LEN),
        "model": hp.get("model_preset") or hp.get("hf_pretrained_model_name_or_dir"),
    }
