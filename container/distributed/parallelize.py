"""Parallelisms applied to an unchanged model, one `apply_*` per concern (torchtitan's layout).

Gradients are reduced as a SUM (divide factor 1): the training loss on each rank is its token
sum over the global token count, so the summed gradient is exactly the gradient of the global
mean loss whatever the mesh. That is what makes every layout match a single process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from container.distributed.expert_parallel import expert_modules
from container.distributed.offload import ActivationOffloader
from container.models.llama import Transformer

log = logging.getLogger("smlaunch")

# Recomputing these costs more than keeping their outputs; everything else (norms, activations,
# RoPE, casts) is cheap to recompute. CPU SDPA has its own flash op name.
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_mm.default,  # torchao's FP8 matmuls
}


def _selective_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


# torchtitan's op-level selective checkpointing (its `_save_list` and `_get_custom_policy`): keep the
# attention output, the reduce-scatters and max (FP8's amax, so recomputation scales alike), and
# every other matmul's output; the even-numbered matmuls of a block are recomputed, which saves
# their outputs' memory for a part of one block's forward. Here biased projections (addmm,
# GPT-NeoX) count as matmuls too, and the CPU flash op as attention.
_OP_SAVE = {
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
    torch._higher_order_ops.flex_attention,
}
_OP_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


def _op_policy_context():
    """A fresh matmul count for each checkpointed call, kept apart for the forward and the
    recomputation, so that both save the same matmuls."""
    counts = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in _OP_MATMULS:
            counts[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if counts[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in _OP_SAVE else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


_CONTEXTS = {"selective": partial(create_selective_checkpoint_contexts, _selective_policy),
             "selective_op": _op_policy_context}


def checkpointed_blocks(layers: int, freq: int) -> list[int]:
    """The indices of the blocks checkpointing wraps: every `freq`-th (the last of each group of
    `freq`), as torchtitan's layer-selective checkpointing picks them; all of them for 1."""
    return [index for index in range(layers) if (index + 1) % freq == 0]


def apply_activation_checkpointing(model: Transformer, mode: str = "full",
                                   offloader: ActivationOffloader | None = None,
                                   checkpoint_fn: Callable | None = None, freq: int = 1) -> None:
    """Wrap every `freq`-th block: `full` recomputes it in backward, `selective` keeps matmul and
    attention outputs, `selective_op` torchtitan's op policy (above). With an `offloader`, what the
    checkpoint keeps (block inputs) lives in host memory. `checkpoint_fn` replaces torch's
    checkpoint (Transformer Engine's, for its FP8 state). A block with dropout (LoRA's) keeps the generator's
    state, so its recomputation drops what its forward dropped; without, that bookkeeping is skipped."""
    blocks = list(model.layers.named_children())
    wrapped_blocks = checkpointed_blocks(len(blocks), freq)
    for index in wrapped_blocks:
        name, block = blocks[index]
        kwargs = {"checkpoint_fn": checkpoint_fn} if checkpoint_fn else {"preserve_rng_state": _has_dropout(block)}
        if mode in _CONTEXTS:
            kwargs["context_fn"] = _CONTEXTS[mode]
        wrapped = checkpoint_wrapper(block, **kwargs)
        if offloader is not None:
            wrapped = offloader.wrap(wrapped, index)
        model.layers.register_module(name, wrapped)
    log.info("applied %s activation checkpointing%s to %d of %d blocks", mode,
             f" with host offload (horizon {offloader.horizon})" if offloader else "", len(wrapped_blocks),
             len(blocks))


def _has_dropout(block: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in block.modules())


def fsdp_units(model: Transformer, wrap_policy: str, min_num_params: int) -> list[nn.Module]:
    """The modules that get their own FSDP unit, innermost first (the root is added last).

    transformer_auto_wrap_policy: each block. size_based_auto_wrap_policy: like FSDP1, any
    subtree whose not-yet-wrapped parameters reach min_num_params."""
    if wrap_policy != "size_based_auto_wrap_policy":
        return list(model.layers.children())
    units, wrapped = [], set()

    def visit(module: nn.Module) -> int:
        if isinstance(module, FSDPModule):  # sharded already (experts over their own mesh)
            return 0
        own = sum(visit(child) for child in module.children())
        own += sum(p.numel() for p in module.parameters(recurse=False) if id(p) not in wrapped)
        if module is not model and own >= min_num_params:
            units.append(module)
            wrapped.update(id(p) for p in module.parameters())
            return 0
        return own

    visit(model)
    return units


def apply_fsdp(model: Transformer, mesh: DeviceMesh, *, param_dtype: torch.dtype | None,
               reshard_after_forward: bool = True, wrap_policy: str = "transformer_auto_wrap_policy",
               min_num_params: int = 100_000_000, persistence_threshold: int = 0,
               max_live_parameters: int | None = None, expert_mesh: DeviceMesh | None = None) -> None:
    """FSDP2 over `mesh` (1-D: full sharding; 2-D: hybrid sharding), mixed precision with fp32
    reduction when `param_dtype` is set. Units below `persistence_threshold` parameters stay
    unsharded between forward and backward (SMP v1's sdp_param_persistence_threshold). Under
    expert parallelism each experts module is first a unit of its own over `expert_mesh`, the
    ranks beside its ep group (container.distributed.expert_parallel)."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if expert_mesh is not None:
        for experts in expert_modules(model):
            fully_shard(experts, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    units = fsdp_units(model, wrap_policy, min_num_params)
    for unit in units:
        size = sum(p.numel() for p in unit.parameters())
        fully_shard(unit, mesh=mesh, mp_policy=mp,
                    reshard_after_forward=reshard_after_forward and size >= persistence_threshold)
    # The root's parameters (embeddings, final norm, output) are needed again at once in backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # plain SUM collectives: gloo has no PREMUL_SUM, and a factor of 1 needs no scaling
            module.set_force_sum_reduction_for_comms(True)
    if max_live_parameters:
        limit_prefetch(units, max_live_parameters)
    log.info("applied FSDP2 to %d unit(s) + root over mesh %s (%s), params %s, reshard after forward %s",
             len(units), tuple(mesh.shape), ",".join(mesh.mesh_dim_names), param_dtype, reshard_after_forward)


def limit_prefetch(units: list[nn.Module], max_live_parameters: int) -> int:
    """SMP v1's sdp_max_live_parameters as FSDP2 explicit prefetching: each unit gathers as many
    following (forward) or preceding (backward) units as fit beside it under the limit, at least
    one. Returns that depth."""
    largest = max(sum(p.numel() for p in unit.parameters()) for unit in units)
    depth = max(1, max_live_parameters // max(largest, 1) - 1)
    for i, unit in enumerate(units):
        unit.set_modules_to_forward_prefetch(units[i + 1: i + 1 + depth])
        unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, i - depth): i])))
    return depth


def allocate(model: Transformer, device: torch.device) -> None:
    """Storage on `device` for a model built on the meta device (values undefined but the RoPE
    tables'), its embedding tie kept."""
    model.to_empty(device=device)
    model.tie_weights()  # to_empty unties a model FSDP did not wrap
    model.init_buffers()


def materialize_on_rank0_init(model: Transformer, build_reference, device: torch.device, seed: int) -> None:
    """Delayed init: the meta-device (and sharded) model gets rank 0's eager initialisation.

    DTensor random init on CPU gives every shard the same values (docs/smp.md), so rank 0 builds
    and initialises a full copy on the host, and the shards are broadcast from it. The result
    equals single-process init with the same seed."""
    import torch.distributed as dist

    allocate(model, device)
    full = None
    if dist.get_rank() == 0:
        reference = build_reference()
        torch.manual_seed(seed)
        reference.init_weights()
        full = reference.state_dict()
    set_model_state_dict(model, full or {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
