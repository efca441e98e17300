"""FP8 matmuls for the attention and MLP projections, with Transformer Engine or torchao.

What runs in FP8: wq, wk, wv, wo, w1, w2, w3 (GPT-NeoX: wqkv, wo, w1, w2, with their biases; torchao
only) of every block whose dimensions are multiples of 16
(both libraries' FP8 GEMMs need that). The embedding and the output head stay in bf16: the head
feeds the loss directly and is where FP8 hurts accuracy most (TE's and torchtitan's recipes
keep it too).

Order in `build_parallel_model`: model (on the meta device under delayed init) -> `apply_fp8` ->
activation checkpointing -> FSDP2 -> weights. Converting first lets the filter see plain module
names and FSDP2 shard the swapped modules' parameters. It works on the meta device: torchao
keeps the nn.Linear's own Parameter, Transformer Engine builds `te.Linear(device="meta")`, and
rank 0's weights arrive later by the usual broadcast. Swapped modules keep nn.Linear's
state-dict keys (`weight` only), so checkpoints and the Hugging Face export are the same with
and without FP8.

Backends (the client's `fp8_*` hyperparameters, `launcher.wire.training.hyperparameters.FP8Config`):
- transformer_engine: `te.Linear` under TE's autocast, recipe "delayed" =
  `DelayedScaling(HYBRID, amax_history_len, amax_compute_algo, margin)`, "current" =
  `Float8CurrentScaling(HYBRID)`. Amaxes are reduced over every rank (see `_amax_group`), and
  activation checkpointing uses `te.distributed.checkpoint` (recompute with the forward's scales,
  no second amax update). TE's FP8 scaling state is not checkpointed: after a resume the amax
  history starts again, as at step 1.
- torchao: `convert_to_float8_training` with torchao's recipe (`Float8LinearConfig.from_recipe_name`):
  "tensorwise" (the client's "current" with torchao means it too), dynamic scaling with one scale
  per tensor, or "rowwise", one scale per row of each operand (rounded to powers of two), more
  accurate, the recipe torchtitan defaults to; its per-row-scaled GEMM needs Hopper (compute
  capability 9.0). torchao has no delayed scaling. Tensorwise only: where FSDP2 shards, weights are
  all-gathered in FP8 (half of bf16's traffic) and one all-reduce after each optimizer step computes
  every weight's scale; torchao gathers rowwise weights in bf16 (its FP8 all-gather is tensorwise
  only), as torchtitan does. Activation scales are per rank (torchao computes them locally).

`fp8_emulate` (tests on CPU, or a GPU without FP8) is torchao's emulation: Transformer Engine
cannot run without FP8 hardware. Where the hardware has FP8, real FP8 runs whatever the flag.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from launcher.wire.training.hyperparameters import FP8Config
from launcher.wire.training.speed import TORCHAO, fp8_recipe_problem, rowwise_capability_problem, torchao_recipe

log = logging.getLogger("smlaunch")

PROJECTIONS = ("wq", "wk", "wv", "wqkv", "wo", "w1", "w2", "w3")  # wqkv: GPT-NeoX's fused q/k/v
MIN_CAPABILITY = (8, 9)  # Ada and Hopper: the first GPUs with FP8 tensor cores
_FIX = ("run on an FP8 GPU (H100/H200: p5, p5e, p5en), or set fp8=0; for tests, fp8_emulate=1 with "
        "fp8_backend=torchao emulates FP8 (slowly)")


def fp8_projections(model: nn.Module) -> tuple[list[str], list[str]]:
    """(names to convert, projections left in bf16 because a dimension is not a multiple of 16)."""
    convert, skipped = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.rpartition(".")[2] in PROJECTIONS:
            fits = module.in_features % 16 == 0 and module.out_features % 16 == 0
            (convert if fits else skipped).append(name)
    return convert, skipped


def describe_device(device: torch.device) -> tuple[bool, str]:
    """(whether the device has FP8 tensor cores, its name and compute capability for messages)."""
    if device.type != "cuda":
        return False, f"{device.type.upper()} (no CUDA compute capability)"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    return (major, minor) >= MIN_CAPABILITY, f"{name} (compute capability {major}.{minor})"


def needs_emulation(cfg: FP8Config, device: torch.device) -> bool:
    """Whether FP8 must be emulated here; refuses hardware without FP8 (or, for rowwise, without
    its per-row-scaled GEMM) unless emulation is allowed and the backend can emulate."""
    has_fp8, what = describe_device(device)
    if has_fp8 and cfg.recipe == "rowwise":
        if problem := rowwise_capability_problem(torch.cuda.get_device_capability(device), what):
            if not cfg.emulate:
                raise RuntimeError(str(problem))
            return True
    if has_fp8:
        return False
    need = ".".join(map(str, MIN_CAPABILITY))
    if not cfg.emulate:
        raise RuntimeError(f"fp8=1 needs FP8 tensor cores (compute capability >= {need}), but this rank "
                           f"runs on {what}. Fix: {_FIX}")
    if cfg.backend == "transformer_engine":
        raise RuntimeError(f"fp8_emulate=1 on {what}: Transformer Engine cannot emulate FP8. "
                           "Fix: set fp8_backend=torchao (its emulation runs anywhere), or run on an "
                           "H100/H200 (p5, p5e, p5en)")
    return True


def apply_fp8(model: nn.Module, cfg: FP8Config, rt) -> None:
    """Swap the projections for FP8 ones (see the module docstring for order and backends).

    `rt` is the container Runtime: its device, world size and layout decide emulation, the TE
    amax group and torchao's FP8 all-gather."""
    if problem := fp8_recipe_problem(cfg.backend, cfg.recipe):
        raise ValueError(str(problem))
    emulate = needs_emulation(cfg, rt.device)
    names, skipped = fp8_projections(model)
    if cfg.backend == "transformer_engine":
        biased = [name for name in names if model.get_submodule(name).bias is not None]
        if biased:
            raise ValueError(f"fp8_backend=transformer_engine with biased projections ({biased[0]}, ...: GPT-NeoX): "
                             "smlaunch swaps in te.Linear without biases; use fp8_backend=torchao")
        if rt.layout.tp > 1:
            raise ValueError("fp8_backend=transformer_engine with tensor_parallel_degree > 1: te.Linear "
                             "does not take DTensor (tensor-parallel) weights; use fp8_backend=torchao")
        _swap_te_linears(model, names)
        _autocast_forward(model, cfg, _amax_group(rt))
        what = f"Transformer Engine, {cfg.recipe} scaling"
        if cfg.recipe == "delayed":
            what += f" (history {cfg.amax_history_len}, {cfg.amax_compute_algo}, margin {cfg.margin})"
    else:
        recipe = torchao_recipe(cfg.recipe)
        all_gather = fp8_all_gather(cfg, rt.world_size > 1 and rt.layout.sharding_group > 1)
        _convert_torchao(model, names, recipe, emulate=emulate, fsdp_float8_all_gather=all_gather)
        what = f"torchao, dynamic {recipe} scaling" + (", FP8 all-gather" if all_gather else "")
        what += ", emulated" if emulate else ""
    if rt.rank == 0:
        log.info("applied FP8 (%s) to %d projections%s", what, len(names),
                 f"; left in bf16 (dims not multiples of 16): {', '.join(skipped)}" if skipped else "")


def activation_checkpoint_fn(cfg: FP8Config, mode: str) -> Callable | None:
    """The checkpoint function blocks need under FP8: Transformer Engine's, which recomputes with
    the forward's scaling state; None (torch's own) otherwise."""
    if not cfg.enabled or cfg.backend != "transformer_engine":
        return None
    if mode != "full":
        # selective keeps aten matmul outputs; TE's FP8 GEMMs are its own ops, never kept
        raise ValueError(f"activation_checkpointing_mode={mode} does not apply to Transformer Engine's "
                         "FP8 GEMMs; use activation_checkpointing_mode=full with fp8_backend=transformer_engine")
    return functools.partial(_te().distributed.checkpoint, use_reentrant=False)


def fp8_all_gather(cfg: FP8Config, sharded: bool) -> bool:
    """Whether FSDP2 all-gathers the weights in FP8: torchao's tensorwise recipe where weights are
    sharded. Rowwise weights are gathered in bf16 (torchao's FP8 all-gather has one scale per tensor)."""
    return sharded and cfg.backend == TORCHAO and torchao_recipe(cfg.recipe) == "tensorwise"


def precompute_fp8_scales(model: nn.Module, cfg: FP8Config) -> None:
    """Call after each optimizer step. torchao tensorwise with FP8 all-gather: one all-reduce
    computes every weight's scale, instead of one per weight inside each all-gather. Not an optimizer
    hook: DCP's optimizer-state load runs a step before the weights load, which would leave stale
    scales. Rowwise has no FP8 all-gather, hence nothing to precompute (torchtitan skips it too)."""
    if cfg.enabled and cfg.backend == TORCHAO and torchao_recipe(cfg.recipe) == "tensorwise":
        _torchao_float8().precompute_float8_dynamic_scale_for_fsdp(model)  # a no-op without FP8 all-gather weights


# --- torchao -----------------------------------------------------------------------------------

# What torchao says while it is imported that is not the user's concern, by logger: that it skips
# its C++ extensions, built for another torch (0.14, the project's pin: pyproject.toml), or that
# they fail to load (newer wheels carry CUDA extensions built for another Python,
# `_C_mxfp8.cpython-310...so`), that Triton is missing, and torch's warning that torchao registers
# an Enum with pytree (a deprecation in newer torchao's own code). All are held below ERROR during
# the import only.
_TORCHAO_IMPORT_NOISE = ("torchao", "torch.utils._pytree")


@functools.cache
def torchao_module(name: str):
    """A torchao module (`torchao.float8`, QLoRA's `torchao.dtypes.nf4tensor`), imported without its noise."""
    loggers = [logging.getLogger(name) for name in _TORCHAO_IMPORT_NOISE]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        return importlib.import_module(name)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _torchao_float8():
    return torchao_module("torchao.float8")


def _convert_torchao(model: nn.Module, names: list[str], recipe: str, *, emulate: bool,
                     fsdp_float8_all_gather: bool) -> None:
    float8 = _torchao_float8()
    config = dataclasses.replace(float8.Float8LinearConfig.from_recipe_name(recipe),
                                 enable_fsdp_float8_all_gather=fsdp_float8_all_gather, emulate=emulate)
    wanted = set(names)
    float8.convert_to_float8_training(model, config=config, module_filter_fn=lambda _, fqn: fqn in wanted)


# --- Transformer Engine ------------------------------------------------------------------------

def _te():
    try:
        import transformer_engine.pytorch as te
    except ImportError as exc:
        raise ImportError("fp8_backend=transformer_engine needs Transformer Engine: pip install "
                          "'smlaunch[fp8]' (or use an image that has it), or set fp8_backend=torchao") from exc
    return te


def te_recipe(cfg: FP8Config):
    """TE's recipe for the client's settings: HYBRID = E4M3 forward, E5M2 gradients."""
    from transformer_engine.common import recipe

    if cfg.recipe == "delayed":
        return recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=cfg.amax_history_len,
                                     amax_compute_algo=cfg.amax_compute_algo, margin=cfg.margin)
    if not hasattr(recipe, "Float8CurrentScaling"):
        raise ImportError("fp8_recipe=current needs Transformer Engine 2.2 or later (Float8CurrentScaling)")
    return recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID)


def _amax_group(rt):
    """Every rank: data- and context-parallel ranks see different tokens, tensor-parallel ranks
    different slices of the same tensors, so the max over all of them gives each tensor the one
    scale a single process would use (Megatron's amax group is likewise DP x TP x CP). The mesh
    spans the world: there is no pipeline parallelism."""
    return dist.group.WORLD if rt.world_size > 1 else None


@functools.cache
def _te_linear_class() -> type:
    te = _te()

    class Linear(te.Linear):
        """te.Linear with nn.Linear's state dict: TE's extra state (FP8 scales and amax history)
        stays out, so checkpoints, delayed-init broadcasts and HF export see the same keys."""

        get_extra_state = nn.Module.get_extra_state
        set_extra_state = nn.Module.set_extra_state

    return Linear


def _swap_te_linears(model: nn.Module, names: list[str]) -> None:
    linear = _te_linear_class()
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        new = linear(old.in_features, old.out_features, bias=False, params_dtype=old.weight.dtype,
                     device=old.weight.device)
        if old.weight.device.type != "meta":  # on meta, weights come with the delayed-init broadcast
            with torch.no_grad():
                new.weight.copy_(old.weight)
        parent.register_module(child, new)


def _autocast_forward(model: nn.Module, cfg: FP8Config, group) -> None:
    """Run the model's forward under TE's autocast, so the loop, validation and any other caller
    get FP8 without knowing the backend (what accelerate does for TE too). An instance attribute:
    FSDP2's hooks and class swap leave it in place."""
    te, recipe = _te(), te_recipe(cfg)
    forward = model.forward

    def autocast():
        if hasattr(te, "autocast"):  # newer TE; fp8_autocast is its deprecated alias
            return te.autocast(enabled=True, recipe=recipe, amax_reduction_group=group)
        return te.fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=group)

    @functools.wraps(forward)
    def fp8_forward(*args, **kwargs):
        with autocast():
            return forward(*args, **kwargs)

    model.forward = fp8_forward
