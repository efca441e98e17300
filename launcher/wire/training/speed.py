"""The runtime's speed choices, named as torchtitan names them, declared once: the FP8 recipes and the
library that runs each, the AdamW implementations, the activation checkpointing modes, the
asynchronous checkpoint modes (`checkpoint_async_mode`) and what each needs. The hyperparameters'
choices, the client's rules (`speed_rules`), the container and the planner read these; nothing here
imports torch.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Problem(NamedTuple):
    """What cannot run, and the fix: an Issue's problem and fix on the client, one message in the container."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}: {self.fix}"

# --- FP8 (container/fp8.py, docs/smp.md "FP8") ------------------------------------------------
TRANSFORMER_ENGINE, TORCHAO = "transformer_engine", "torchao"
# recipe -> the libraries that run it. "current" is Transformer Engine's Float8CurrentScaling; with
# torchao it is torchao's tensorwise (dynamic scaling, one scale per tensor), its name before
# torchao's recipes existed, kept so that jobs written then run unchanged.
FP8_RECIPE_BACKENDS = {
    "delayed": (TRANSFORMER_ENGINE,),
    "current": (TRANSFORMER_ENGINE, TORCHAO),
    "tensorwise": (TORCHAO,),
    "rowwise": (TORCHAO,),
}
FP8_RECIPES = tuple(FP8_RECIPE_BACKENDS)
# torchao's rowwise GEMM is `torch._scaled_mm` with one scale per row, which CUDA runs on Hopper
# (compute capability 9.0) and later only (torchao's own check: `is_sm_at_least_90`); Ada (8.9: L4,
# L40S) runs tensorwise FP8 only.
ROWWISE_MIN_CAPABILITY = (9, 0)


def torchao_recipe(recipe: str) -> str:
    """torchao's recipe name (`Float8LinearConfig.from_recipe_name`) for an fp8_recipe."""
    return "tensorwise" if recipe == "current" else recipe


def default_fp8_backend(recipe: str | None) -> str:
    """The library when fp8_backend is unset: the recipe's only one, else Transformer Engine."""
    backends = FP8_RECIPE_BACKENDS.get(recipe or "delayed", (TRANSFORMER_ENGINE,))
    return backends[0] if len(backends) == 1 else TRANSFORMER_ENGINE


def fp8_recipe_problem(backend: str, recipe: str) -> Problem | None:
    """Why `backend` cannot run `recipe` (with the fix), or None."""
    runs = FP8_RECIPE_BACKENDS[recipe]
    if backend in runs:
        return None
    if backend == TORCHAO:
        return Problem(f"fp8_recipe={recipe} is Transformer Engine's (torchao has no delayed scaling) and "
                       f"fp8_backend={backend} cannot run it",
                       "use fp8_recipe tensorwise or rowwise with torchao, or fp8_backend=transformer_engine")
    return Problem(f"fp8_recipe={recipe} is torchao's and fp8_backend={backend} cannot run it",
                   "set fp8_backend=torchao, or use fp8_recipe delayed or current with Transformer Engine")


def rowwise_capability_problem(capability: tuple[int, int], where: str) -> Problem | None:
    """Why rowwise FP8 cannot run on a GPU of `capability` (described by `where`), or None."""
    if tuple(capability) >= ROWWISE_MIN_CAPABILITY:
        return None
    need = ".".join(map(str, ROWWISE_MIN_CAPABILITY))
    return Problem(f"fp8_recipe=rowwise needs compute capability >= {need} (Hopper, H100/H200, p5 and later) for "
                   f"its per-row-scaled FP8 GEMM, but {where} has {'.'.join(map(str, capability))}",
                   "use fp8_recipe=tensorwise there, or an H100/H200 instance")


# --- optimizer (container/optim.py) -------------------------------------------------------------
FUSED, FOREACH, FOR_LOOP = "fused", "foreach", "for-loop"
OPTIMIZER_IMPLEMENTATIONS = (FUSED, FOREACH, FOR_LOOP)
# What each optimizer can run: AnyPrecisionAdamW (container/optim.py) is a loop over parameters.
OPTIMIZER_CAN_RUN = {"adamw": OPTIMIZER_IMPLEMENTATIONS, "anyprecision": (FOR_LOOP,)}


def default_optimizer_implementation(optimizer: str, device_type: str) -> str:
    """fused AdamW on CUDA, where it is one kernel for every parameter and reads no step counter on
    the host (torchtitan's default; DTensor parameters take it); for-loop elsewhere, what torch itself
    picks for CPU parameters, so CPU runs keep their numerics; anyprecision runs its own loop."""
    if optimizer != "adamw":
        return FOR_LOOP
    return FUSED if device_type == "cuda" else FOR_LOOP


def optimizer_implementation_problem(optimizer: str, implementation: str) -> Problem | None:
    """Why `optimizer` cannot run as `implementation` (with the fix), or None."""
    if implementation in OPTIMIZER_CAN_RUN[optimizer]:
        return None
    runs = ", ".join(OPTIMIZER_CAN_RUN[optimizer])
    return Problem(f"optimizer={optimizer} has no {implementation} implementation (it runs {runs})",
                   "leave optimizer_implementation unset, or use optimizer=adamw")


# --- activation checkpointing (container/distributed/parallelize.py) -----------------------------
# full: recompute each block; selective: keep every matmul and attention output (recompute the
# cheap element-wise ops); selective_op: torchtitan's op policy, which keeps the attention output
# and every other matmul's (recomputing the other half of the matmuls for memory).
AC_MODES = ("full", "selective", "selective_op")


# --- Windows of steps: profile_steps (container/profiling.py, docs/speed.md "Profiling steps") and
# memory_snapshot_steps (container/memory_snapshots.py) ---------------------------------------------
PROFILE_STEPS_FORM = "FIRST-LAST (training steps, counted from 1, both recorded: 5-7) or one step (5)"
# the first steps compile, fill the allocator's pool and make the first all-gathers: not the steady step
PROFILE_WARMUP_STEPS = 2


def profile_window(text: str) -> tuple[int, int]:
    """A window's (first, last) step (profile_steps, memory_snapshot_steps); ValueError saying what is wrong."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(text))
    if not match:
        raise ValueError(f"is not {PROFILE_STEPS_FORM}")
    first, last = int(match[1]), int(match[2] or match[1])
    if first < 1 or last < first:
        raise ValueError(f"is not {PROFILE_STEPS_FORM}: the first step is 1 or later and the last is not before it")
    return first, last


def profile_problem(text: str, max_steps: int, name: str = "profile_steps") -> Problem | None:
    """What is wrong with the window `name` (profile_steps, memory_snapshot_steps) for a run of
    `max_steps` steps, or None."""
    try:
        first, last = profile_window(text)
    except ValueError as exc:
        return Problem(str(exc), f"write e.g. {name}: 5-7, or remove it")
    if last > max_steps:
        return Problem(f"reaches past the run's last step, max_steps = {max_steps}",
                       f"set {name}: {min(first, max_steps)}-{max_steps} or fewer, or raise max_steps")
    return None


# --- Asynchronous checkpoints (container/checkpoint/background.py, docs/checkpoints.md) -----------
# The modes of `checkpoint_async_mode`, named as torchtitan's `checkpoint.async_mode`: `disabled`
# saves while every rank waits; `async` copies the model and optimizer state to host memory and
# writes it in a background thread while training goes on; `async_with_pinned_mem` stages into pinned
# (page-locked) host memory, which a GPU copies into faster, and keeps that buffer from save to save.
DISABLED = "disabled"
ASYNC = "async"
PINNED = "async_with_pinned_mem"
ASYNC_MODES = (DISABLED, ASYNC, PINNED)


def is_async(mode: str | None) -> bool:
    return mode not in (None, DISABLED)


def needs_cuda(mode: str | None) -> bool:
    """Pinned memory is CUDA's page-locked host memory: without a CUDA device there is none."""
    return mode == PINNED


NO_CUDA_FIX = "use checkpoint_async_mode: async (plain host copies), or run on a GPU instance"
