"""What `compile: 1` composes with (container.distributed.compile; docs/smp.md, "compile"). A
compiled block is one graph or nothing (fullgraph): what dynamo cannot trace, or traces into
wrong numbers, is refused here by name with the fix, never left to run eager. Validation runs
these for smlaunch's train.py; the container runs them again before anything is built."""

from __future__ import annotations

from launcher.config.distribution import ModelParallelParameters
from launcher.config.hyperparameters import FP8Config, TrainingHyperparameters
from launcher.config.issues import Issue
from launcher.config.rules import is_moe

HP = "hyperparameters"
MP = "distribution.smdistributed.modelparallel.parameters"
# The container refuses it too, where the model's blocks are built (container.distributed.compile).
MOE_REFUSAL = ("compile=1 with a mixture-of-experts model is not supported: its routing gives each expert a "
               "data-dependent number of tokens (a split by counts.tolist()), which one graph cannot hold")
MOE_FIX = "set compile=0, or train a dense model"


def compile_issues(hp: TrainingHyperparameters, params: ModelParallelParameters | None) -> list[Issue]:
    if not hp.compile:
        return []
    params = params if params is not None else ModelParallelParameters()
    refusals = []  # (field, value, what, why, other fix)
    if (params.tensor_parallel_degree or 1) > 1:
        refusals.append((f"{MP}.tensor_parallel_degree", params.tensor_parallel_degree, "tensor parallelism",
                         "on torch 2.13 the compiled vocabulary-parallel loss (loss_parallel) and the compiled "
                         "sequence-parallel blocks compute other losses and gradients than eager ones",
                         "tensor_parallel_degree=1 (FSDP, context or pipeline parallelism compile)"))
    fp8 = FP8Config.from_hyperparameters(hp)
    if fp8.enabled and fp8.backend == "transformer_engine":
        refusals.append((f"{HP}.fp8_backend", fp8.backend, "Transformer Engine's FP8",
                         "te.Linear and its FP8 autocast are not traceable by torch.compile (graph breaks)",
                         "fp8_backend=torchao, whose float8 linears compile"))
    return [Issue(field, value, f"compile=1 with {what} is not supported: {why}",
                  f"set compile=0, or {fix}") for field, value, what, why, fix in refusals]


def check_compile(ctx) -> list[Issue]:
    """compile_issues for smlaunch's runtime (rules.Context), and the model's; a user's own script
    reads the key as it likes."""
    if not ctx.runtime or not ctx.hp.compile:
        return []
    issues = compile_issues(ctx.hp, ctx.params)
    if is_moe(ctx):
        issues.append(Issue(f"{HP}.compile", ctx.hp.compile, MOE_REFUSAL, MOE_FIX))
    return issues
