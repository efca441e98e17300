"""What the speed choices (launcher.wire.training.speed, and `compile: 1`) ask of a job run by
smlaunch's train.py: an FP8 recipe its library runs, rowwise FP8 on a GPU that has its GEMM, an
optimizer implementation the optimizer has, activation checkpointing settings that apply, steps to
profile that the run has, and what compile composes with (`compile_issues`: a compiled block is one
graph or nothing, fullgraph, so what dynamo cannot trace, or traces into wrong numbers, is refused
here by name with the fix, never left to run eager; container.distributed.compile, docs/smp.md
"compile"). Validation runs these, with rowwise FP8 against the instance's GPU and compile against
the job's model (launcher.config.runtime_rules); the container runs `speed_issues` and
`compile_issues` again before anything is built (and checks the GPU it finds itself)."""

from __future__ import annotations

from launcher.wire.training.hyperparameters import FP8Config, TrainingHyperparameters
from launcher.wire.training.issues import Issue
from launcher.wire.training.run_settings import DEFAULT_MAX_STEPS
from launcher.wire.training.speed import (
    PROFILE_WARMUP_STEPS,
    Problem,
    fp8_recipe_problem,
    optimizer_implementation_problem,
    profile_problem,
    profile_window,
)

HP = "hyperparameters"
# The container refuses it too, where the model's blocks are built (container.distributed.compile).
MOE_REFUSAL = ("compile=1 with a mixture-of-experts model is not supported: its routing gives each expert a "
               "data-dependent number of tokens (a split by counts.tolist()), which one graph cannot hold")
MOE_FIX = "set compile=0, or train a dense model"


def speed_issues(hp: TrainingHyperparameters) -> list[Issue]:
    issues = []
    fp8 = FP8Config.from_hyperparameters(hp)
    if fp8.enabled and (problem := fp8_recipe_problem(fp8.backend, fp8.recipe)):
        where = "fp8_recipe" if hp.fp8_recipe is not None else "fp8_backend"
        issues.append(_issue(where, getattr(hp, where), problem))
    if fp8.enabled and fp8.backend == "transformer_engine" and hp.activation_checkpointing and (
            hp.activation_checkpointing_mode or "full") != "full":
        issues.append(Issue(f"{HP}.activation_checkpointing_mode", hp.activation_checkpointing_mode,
                            "keeps aten matmul outputs, and Transformer Engine's FP8 GEMMs are its own ops",
                            "use activation_checkpointing_mode: full with fp8_backend: transformer_engine, or "
                            "fp8_backend: torchao"))
    if hp.optimizer_implementation is not None and (
            problem := optimizer_implementation_problem(hp.optimizer or "adamw", hp.optimizer_implementation)):
        issues.append(_issue("optimizer_implementation", hp.optimizer_implementation, problem))
    if hp.activation_checkpointing_freq is not None:
        if not hp.activation_checkpointing:
            issues.append(Issue(f"{HP}.activation_checkpointing_freq", hp.activation_checkpointing_freq,
                                "says which blocks activation checkpointing wraps, but activation_checkpointing "
                                "is off", "set activation_checkpointing: 1, or remove activation_checkpointing_freq"))
        elif hp.activation_checkpointing_freq > 1 and hp.offload_activations:
            issues.append(Issue(f"{HP}.activation_checkpointing_freq", hp.activation_checkpointing_freq,
                                "offload_activations moves every block's checkpointed input to host memory, and "
                                "with a frequency above 1 some blocks keep everything on the GPU",
                                "use activation_checkpointing_freq: 1 with offload_activations, or turn offload off"))
    for name in ("profile_steps", "memory_snapshot_steps"):
        window = getattr(hp, name)
        if window is not None and (problem := profile_problem(window, hp.max_steps or DEFAULT_MAX_STEPS, name)):
            issues.append(_issue(name, window, problem))
    return issues


def profile_notes(hp: TrainingHyperparameters) -> list[Issue]:
    """A profile that starts in the warm-up: its steps are not the steady step's."""
    if hp.profile_steps is None or profile_problem(hp.profile_steps, hp.max_steps or DEFAULT_MAX_STEPS):
        return []
    first, _ = profile_window(hp.profile_steps)
    if first > PROFILE_WARMUP_STEPS:
        return []
    return [Issue(f"{HP}.profile_steps", hp.profile_steps,
                  f"profiles warm-up: the first {PROFILE_WARMUP_STEPS} steps compile, fill the allocator's pool and "
                  "make the first all-gathers", f"start at step {PROFILE_WARMUP_STEPS + 1} or later to see the "
                  "steady step", level="warning")]


def compile_issues(hp: TrainingHyperparameters) -> list[Issue]:
    """What the hyperparameters ask for that compile cannot compile. FSDP, tensor, context and
    pipeline parallelism compose (tensor parallelism with container.distributed.compile's three
    torch 2.13 workarounds); a mixture-of-experts model does not (runtime_rules.check_compile)."""
    fp8 = FP8Config.from_hyperparameters(hp)
    if not hp.compile or not (fp8.enabled and fp8.backend == "transformer_engine"):
        return []
    return [Issue(f"{HP}.fp8_backend", fp8.backend, "compile=1 with Transformer Engine's FP8 is not supported: "
                  "te.Linear and its FP8 autocast are not traceable by torch.compile (graph breaks)",
                  "set compile=0, or fp8_backend=torchao, whose float8 linears compile")]


def _issue(key: str, value, problem: Problem) -> Issue:
    return Issue(f"{HP}.{key}", value, problem.what, problem.fix)
