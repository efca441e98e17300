"""Tensor parallelism (SMP's `tensor_parallel_degree`): Megatron-style sharded attention and MLP
with sequence-parallel norms, applied to the unchanged model with `parallelize_module`
(torchtitan's plan).

Within a block the activations between the sub-layers are split along the sequence over the tp
ranks (Shard(1)): norms run on a rank's slice of the sequence; the attention and MLP inputs are
all-gathered, wq/wk/wv and w1/w3 are split by output features (so each rank owns whole heads:
the attention's `view(bsz, seq, -1, head_dim)` sees the local head count), and wo/w2 are split
by input features, their partial sums reduce-scattered back to sequence slices. The tokens,
and so the RoPE tables and positions the model builds from them, are the same on every tp rank;
the attention's input is the whole (tp-gathered) sequence, so they fit it unchanged, also when
context parallelism later passes a rank's chunk positions.

GPT-NeoX's block (container.models.gpt_neox) has its own plan of the same kind: its fused q/k/v
projection is laid out head by head, so the column split gives each rank whole heads with their
q, k and v; its biases are split with their weights (column-parallel) or added once to the
reduced output (row-parallel), and its LayerNorms are sequence-parallel like RMSNorm. With its
parallel residual both norms read the block's sequence slice.

LoRA's adapters (container.models.lora) follow their base's split, as torchtitan's do: under a
column-parallel base A is replicated and B split by output features like the base, so each rank
adds its own output features' update; under a row-parallel base A is split by input features like
the base and B replicated, so the update is a partial sum like the base's output, reduced with it.

The logits stay split by vocabulary (a DTensor, Shard(-1)): the full [batch, seq, vocab] fp32
logits are what ran the seed's 8B job out of memory, so each rank keeps 1/tp of them and the
cross-entropy runs vocabulary-parallel (torch's `loss_parallel`, inside `loss_context`, which
must also hold the backward). Every tp rank then holds the same loss, and DTensor's backward
keeps the gradients those of one model.
"""

from __future__ import annotations

import contextlib
import logging

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from container.models.llama import Transformer
from container.models.lora import LoRALinear

log = logging.getLogger("smlaunch")
# (column-parallel, row-parallel) projections of a block
LLAMA_PROJECTIONS = (("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"),
                     ("attention.wo", "feed_forward.w2"))
GPT_NEOX_PROJECTIONS = (("attention.wqkv", "feed_forward.w1"), ("attention.wo", "feed_forward.w2"))


def check_tp_degree(model: Transformer, tp: int) -> None:
    """Every split must be even: heads (whole heads per rank), MLP features, the vocabulary's rows
    (padded where the vocabulary does not split: launcher.wire.training.models.vocab_rows), and the
    sequence (sequence-parallel slices are rebuilt from local tensors assuming equal sizes)."""
    args = model.args
    sizes = {"attention heads": args.n_heads, "key/value heads": args.n_kv_heads,
             "MLP features": args.ffn_dim, "vocabulary rows": args.vocab_rows,
             "sequence length (max_context_width)": args.max_seq_len}
    uneven = [f"{n} {label}" for label, n in sizes.items() if n % tp]
    if uneven:
        raise ValueError(f"tensor_parallel_degree {tp} must divide the model's {', '.join(uneven)}")


def apply_tp(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Shard `model`'s parameters over the 1-D `tp_mesh` (before activation checkpointing and
    FSDP, which then shards the same parameters over the data-parallel dimensions)."""
    check_tp_degree(model, tp_mesh.size())
    # torch's SequenceParallel registers the norms' weights anew, requiring gradients: a frozen base
    # (LoRA's) must stay frozen, so each parameter's requires_grad is put back afterwards
    frozen = {name for name, parameter in model.named_parameters() if not parameter.requires_grad}
    top = {
        # tokens are replicated; each rank looks up its vocabulary rows, the partial embeddings
        # are reduce-scattered into sequence slices
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    # a pipeline stage holds some of them; between stages the hidden states stay sequence slices
    parallelize_module(model, tp_mesh, {name: plan for name, plan in top.items() if getattr(model, name) is not None})
    # parallelize_module replaced each module's weight with its own DTensor; both are the
    # vocabulary dimension split the same way (Shard(0)), so the tie can be restored as is
    model.tie_weights()
    mask = getattr(model.output, "vocab_mask", None)
    if mask is not None:  # the padding logits' mask, split like the logits it is added to (the plan replicated it)
        model.output.vocab_mask = mask.redistribute(tp_mesh, [Shard(0)]) if isinstance(mask, DTensor) else (
            distribute_tensor(mask, tp_mesh, [Shard(0)]))
    projections = GPT_NEOX_PROJECTIONS if model.args.family == "gpt_neox" else LLAMA_PROJECTIONS
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            # (x, cos, sin, mask): x gathered to the whole sequence; the RoPE tables and the document
            # mask (or None) are plain tensors every rank holds whole
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                            desired_input_layouts=(Replicate(), None, None, None)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            **{name: _colwise(block.get_submodule(name)) for name in projections[0]},
            **{name: _rowwise(block.get_submodule(name), output_layouts=Shard(1)) for name in projections[1]},
        })
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name not in frozen)
    log.info("applied tensor parallelism (degree %d, sequence-parallel norms) to %d blocks",
             tp_mesh.size(), len(model.layers))


def _colwise(module) -> ColwiseParallel:
    return LoRAColwiseParallel() if isinstance(module, LoRALinear) else ColwiseParallel()


def _rowwise(module, **layouts) -> RowwiseParallel:
    return LoRARowwiseParallel(**layouts) if isinstance(module, LoRALinear) else RowwiseParallel(**layouts)


class LoRAColwiseParallel(ColwiseParallel):
    """ColwiseParallel of a LoRALinear: its base weight (and bias) and B split by output features
    (Shard(0)); A is left to distribute_module, which replicates it."""

    def _partition_linear_fn(self, name, module, device_mesh):
        if name in ("", "lora_B"):  # "": the LoRALinear itself, whose own parameters are the base's
            for key, param in list(module.named_parameters(recurse=False)):
                module.register_parameter(key, nn.Parameter(
                    distribute_tensor(param, device_mesh, [Shard(0)], src_data_rank=self.src_data_rank),
                    requires_grad=param.requires_grad))


class LoRARowwiseParallel(RowwiseParallel):
    """RowwiseParallel of a LoRALinear: its base weight and A split by input features (Shard(1)), the
    bias replicated; B is left to distribute_module, which replicates it."""

    def _partition_linear_fn(self, name, module, device_mesh):
        if name in ("", "lora_A"):
            super()._partition_linear_fn(name, module, device_mesh)


def loss_context(tp: int) -> contextlib.AbstractContextManager:
    """What the loss and its backward run in: with tp > 1 the logits are vocabulary-sharded
    DTensors, and cross-entropy over them needs torch's loss-parallel kernels."""
    return loss_parallel() if tp > 1 else contextlib.nullcontext()
