"""QLoRA's base (load_in_4bit, docs/lora.md): the blocks' frozen linear weights held as torchao's
NF4Tensor, as torchtune's QLoRA holds them.

What is quantized is what peft's `load_in_4bit` (bitsandbytes' Linear4bit) quantizes: every linear
layer but the head, here every linear layer of the blocks (the adapters' bases and the layers without
adapters); the embedding, the norms, the head and the adapters keep their dtypes. NF4 (Dettmers et
al., 2023): one absmax scale per 64 weights, each weight the nearest of 16 normal-float levels; the
scales double-quantized (int8 in blocks of 256, their mean subtracted). The forward dequantizes the
weight to the input's dtype (torchao's F.linear), so the adapters and the rest compute as before.

The weights are quantized once loaded (each fp32 weight freed as its NF4 replaces it) and before
FSDP shards them: a shard is then rows of the whole tensor's quantization, the same at every world
size. A state dict (the export's) holds each base weight dequantized, as fp32: the merged model is
the NF4 base's dequantized weights plus the adapters' update (peft's merge of a 4-bit layer
quantizes that sum again; this export does not). A
checkpoint holds no base (base_left_out): a resumed run loads and quantizes it as the first did.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from container.fp8 import torchao_module
from container.models.lora import is_adapter
from launcher.wire.training.lora import NF4_BLOCK, NF4_SCALER_BLOCK, QLORA_EXTRA

log = logging.getLogger("smlaunch")
NF4 = "torchao.dtypes.nf4tensor"
_LEFT_OUT = contextvars.ContextVar("nf4_base_left_out", default=False)  # inside base_left_out()


def require_torchao() -> None:
    """Exit 2 before anything is built where torchao is not installed, naming what installs it."""
    try:
        torchao_module(NF4)
    except ImportError as exc:
        log.error("hyperparameters.load_in_4bit = true: QLoRA's NF4 base needs torchao, which this environment "
                  "lacks (%s); %s, or use an image that has it", exc, QLORA_EXTRA)
        raise SystemExit(2) from exc


def quantized_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(name, layer) of every linear layer in the blocks but the adapters: what QLoRA quantizes."""
    return [(f"layers.{index}.{name}", module) for index, block in model.layers.items()
            for name, module in block.named_modules()
            if isinstance(module, nn.Linear) and not is_adapter(f"{name}.weight")]


def quantize_base(model: nn.Module, shards: int = 1) -> None:
    """Replace each quantized layer's weight by its NF4 (frozen); `shards`: how many FSDP shards each
    will be cut into, which must each hold whole blocks of scales."""
    to_nf4 = torchao_module(NF4).to_nf4
    for name, layer in quantized_layers(model):
        _check_shardable(name, layer.weight, shards)
        # the fp32 weight is freed once its NF4 replaces it: one layer's at a time beside the base
        layer.weight = nn.Parameter(to_nf4(layer.weight.detach(), NF4_BLOCK, NF4_SCALER_BLOCK), requires_grad=False)
        layer.in_nf4 = True
        layer.register_state_dict_post_hook(_dequantized_in_state_dict)


def is_quantized(model: nn.Module) -> bool:
    """Whether the model's base is in NF4 (quantize_base)."""
    return any(getattr(module, "in_nf4", False) for module in model.modules())


@contextlib.contextmanager
def base_left_out():
    """State dicts taken inside leave the NF4 base out: a checkpoint's, as the base is the pretrained
    weights' (or the seed's), quantized alike again when a resumed run starts; loads then expect none."""
    token = _LEFT_OUT.set(True)
    try:
        yield
    finally:
        _LEFT_OUT.reset(token)


def _check_shardable(name: str, weight: torch.Tensor, shards: int) -> None:
    unit = NF4_BLOCK * NF4_SCALER_BLOCK * shards
    if weight.numel() % unit or weight.shape[0] % shards:
        raise ValueError(f"hyperparameters.load_in_4bit: {name} ({tuple(weight.shape)}) cannot be cut into {shards} "
                         f"FSDP shards of whole NF4 scale blocks ({NF4_BLOCK} x {NF4_SCALER_BLOCK} weights each): "
                         "shard over fewer ranks (hybrid_shard_degree), or remove load_in_4bit")


def allocate_constants(model: nn.Module, device: torch.device) -> None:
    """After `to_empty` of a model quantized on the meta device (plan --trace's): each NF4 weight's
    level table and scales' mean on `device` too (torchao's empty_like moves only its codes and scales)."""
    for _, layer in quantized_layers(model):
        weight = layer.weight._local_tensor if isinstance(layer.weight, DTensor) else layer.weight
        weight.nf4 = torch.empty_like(weight.nf4, device=device)
        weight.scaler_mean = torch.empty_like(weight.scaler_mean, device=device)


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """An NF4 weight (or an FSDP shard of one, a DTensor) as the values it stands for, in its dtype."""
    if isinstance(weight, DTensor):
        return DTensor.from_local(weight.to_local().get_original_weight(), weight.device_mesh, weight.placements,
                                  shape=weight.shape, stride=weight.stride())
    return weight.get_original_weight()


def _dequantized_in_state_dict(module: nn.Module, state_dict: dict, prefix: str, _metadata) -> None:
    """A state dict holds the base dequantized: torch's state-dict gathering does not gather NF4 shards,
    and the export writes (and merges) the values the NF4 base computed with; a checkpoint's, none."""
    if _LEFT_OUT.get():
        del state_dict[f"{prefix}weight"]
    else:
        state_dict[f"{prefix}weight"] = dequantized(state_dict[f"{prefix}weight"])
