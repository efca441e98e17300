"""QLoRA's NF4 written out, the reference torchao's (container/models/qlora.py) is compared with: the QLoRA
paper's code book and blockwise absmax quantization with double-quantized scales; and the tiny Llama
shapes whose every linear layer NF4 quantizes whole (at world 1 and 2)."""

from __future__ import annotations

import torch

from launcher.wire.training.lora import NF4_BLOCK, NF4_SCALER_BLOCK

# NF4's 16 levels as the QLoRA paper publishes them (Dettmers et al., 2023, appendix E; bitsandbytes'
# NF4 table): the quantiles of N(0, 1) normalised to [-1, 1], 0 exact
PAPER_NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
             0.7229568362236023, 1.0)
# torchao stores them to 4 decimals
TORCHAO_NF4 = tuple(round(level, 4) for level in PAPER_NF4)
# every linear layer's weights whole blocks of 64 x 256 at world 1 and 2 (q 256x256, k and v 128x256, ffn 512)
QLORA_SHAPES = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}
# a block's linear layers by transformers' names: Llama's and GPT-NeoX's
BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "query_key_value",
                 "dense", "dense_h_to_4h", "dense_4h_to_h")


def nf4_round_trip(weight: torch.Tensor, levels: tuple[float, ...] = TORCHAO_NF4) -> torch.Tensor:
    """NF4 written out: each block of 64 weights scaled by its absmax to the nearest of the 16 levels;
    the absmaxes less their mean in blocks of 256, each block's scaled to int8 by 256 / (2 x its absmax)
    and rounded (double quantization); returns the values the codes and scales stand for."""
    table = torch.tensor(levels, dtype=weight.dtype)
    blocks = weight.reshape(-1, NF4_BLOCK)
    absmax = blocks.abs().amax(dim=1)
    codes = (blocks / absmax[:, None]).unsqueeze(-1).sub(table).abs().argmin(dim=-1)
    mean = absmax.mean()
    centred = (absmax - mean).reshape(-1, NF4_SCALER_BLOCK)
    factor = 256 / (2 * centred.abs().amax(dim=1, keepdim=True))
    scales = ((centred * factor).round().clamp(-128, 127) / factor).flatten() + mean
    return (table[codes] * scales[:, None]).reshape(weight.shape)


@torch.no_grad()
def nf4_base(model):
    """A transformers Llama (or GPT-NeoX) with every block's linear weights replaced by their NF4 round
    trip (in place)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in BLOCK_LINEARS and ".layers." in f".{name}":
            module.weight.copy_(nf4_round_trip(module.weight))
    return model
