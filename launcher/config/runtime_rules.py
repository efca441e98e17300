"""Validate's side of the checks smlaunch's runtime repeats before it builds anything (the
hyperparameters' rules: speed_rules, tracker_rules, nonfinite, lora): each applies
to a job that runs smlaunch's train.py only (a user's own script reads these keys as it likes),
and adds what only the client knows of the job (context.Context): the instance's GPU, the model it
resolved, the job's max_restarts."""

from __future__ import annotations

from launcher.config.context import Context
from launcher.config.rules import HP, MP, is_moe
from launcher.wire.training.hyperparameters import FP8Config
from launcher.wire.training.issues import Issue
from launcher.wire.training.layout import sharding_group, with_sharding_strategy
from launcher.wire.training.lora import lora_issues, model_lora_issues
from launcher.wire.training.nonfinite import ROLLBACK, nonfinite_issues
from launcher.wire.training.speed import rowwise_capability_problem
from launcher.wire.training.speed_rules import MOE_FIX, MOE_REFUSAL, compile_issues, profile_notes, speed_issues
from launcher.wire.training.tracker_rules import tracker_issues


def check_compile(ctx: Context) -> list[Issue]:
    """compile_issues, and the model's: a mixture of experts does not compile."""
    if not ctx.runtime or not ctx.hp.compile:
        return []
    issues = compile_issues(ctx.hp)
    if is_moe(ctx):
        issues.append(Issue(f"{HP}.compile", ctx.hp.compile, MOE_REFUSAL, MOE_FIX))
    return issues


def check_speed(ctx: Context) -> list[Issue]:
    """speed_issues and profile_notes, rowwise FP8 against the instance's GPU, and memory snapshots
    where there is no CUDA GPU."""
    if not ctx.runtime:
        return []
    issues = speed_issues(ctx.hp) + profile_notes(ctx.hp) + _snapshots_without_cuda(ctx)
    fp8 = FP8Config.from_hyperparameters(ctx.hp)
    acc = ctx.instance.accelerator if ctx.instance else None
    # an accelerator without FP8 at all is check_precision's issue; this one has FP8 but maybe not rowwise's GEMM
    if fp8.enabled and fp8.recipe == "rowwise" and not fp8.emulate and acc is not None and acc.fp8:
        where = f"{acc.model} ({ctx.instance.name})"
        if problem := rowwise_capability_problem(acc.compute_capability, where):
            issues.append(Issue(f"{HP}.fp8_recipe", "rowwise", problem.what, problem.fix))
    return issues


def _snapshots_without_cuda(ctx: Context) -> list[Issue]:
    """memory_snapshot_steps records CUDA's caching allocator: an instance without a CUDA GPU gets no
    snapshot (said here; the runtime logs it too). local_gpu's GPU is found at run time."""
    window, instance = ctx.hp.memory_snapshot_steps, ctx.instance
    if window is None or instance is None or instance.accelerators is None:
        return []
    acc = instance.accelerator
    if instance.accelerators and acc is not None and acc.vendor == "nvidia":
        return []
    has = "no GPU" if not instance.accelerators or acc is None else f"{acc.model}, not a CUDA GPU"
    return [Issue(f"{HP}.memory_snapshot_steps", window,
                  f"records the CUDA caching allocator's history, and {instance.name} has {has}: the job will "
                  "write no memory snapshot", "run it on an NVIDIA instance (ml.p4d, ml.p5, ml.g5, ...) or "
                  "local_gpu, or remove memory_snapshot_steps", level="warning")]


def check_trackers(ctx: Context) -> list[Issue]:
    """tracker_issues."""
    return tracker_issues(ctx.hp) if ctx.runtime else []


def check_nonfinite(ctx: Context) -> list[Issue]:
    """nonfinite_issues, and a rollback's restart (the restart budget is the job's, not the runtime's)."""
    if not ctx.runtime:
        return []
    return nonfinite_issues(ctx.hp) + _rollback_restarts(ctx.job)


def _rollback_restarts(job) -> list[Issue]:
    """A rollback is a restart (the ranks leave, the bootstrap starts them again from the checkpoint):
    without max_restarts nothing restarts them, and the job would fail at its first non-finite step
    as under fail, while its log says it rolls back. Refused rather than quietly run as fail."""
    if job.hyperparameters.nonfinite_policy != ROLLBACK or job.max_restarts:
        return []
    return [Issue(f"{HP}.nonfinite_policy", ROLLBACK, "restarts the job from its newest checkpoint at a "
                  "non-finite step, but max_restarts is 0, so nothing restarts it: the job would fail there",
                  "set max_restarts: N (each rollback uses one restart), or use nonfinite_policy: skip or fail")]


def check_lora(ctx: Context) -> list[Issue]:
    """lora_issues, and the targets against the model where the client resolved it (the runtime checks
    them again against the model it loads)."""
    if not ctx.runtime:
        return []
    issues = lora_issues(ctx.hp, ctx.params, MP)
    return issues + (model_lora_issues(ctx.hp, ctx.model, _shards(ctx)) if ctx.model is not None else [])


def _shards(ctx: Context) -> int:
    """The sharding group the runtime cuts each parameter into, where the world is known (else 1)."""
    if ctx.world is None:
        return 1
    return sharding_group(with_sharding_strategy(ctx.params, ctx.hp.sharding_strategy, ctx.processes_per_host),
                          ctx.world)
