"""GPT-NeoX's block (transformers' `GPTNeoXLayer`), for AWS's `model_type: gpt_neox` and Pythia-style
checkpoints.

What differs from Llama's block: LayerNorms with bias; one fused, biased q/k/v projection whose
output is laid out head by head (each head's q, k and v side by side, as transformers' checkpoint
holds it), so tensor parallelism's column split gives each rank whole heads with their q, k and
v; RoPE on the first `rotary_dim` dimensions of each head only (`rotary_pct`); a GELU MLP of two
biased matrices; and, with `parallel_residual` (AWS's script always sets it), attention and MLP
read the same input and both add to the residual: x + attn(ln1(x)) + mlp(ln2(x)). Without it they
run one after the other, as in Llama.

Module names follow the runtime's Llama (`attention.wqkv`, `attention.wo`, `feed_forward.w1`,
`feed_forward.w2`, `attention_norm`, `ffn_norm`), so activation checkpointing, FSDP, FP8 and the
tensor-parallel plan find them by the same names; `container.checkpoint.hf_export` maps them to
Hugging Face's (`gpt_neox.layers.N.attention.query_key_value`, ...). No dropout: AWS's script
builds GPT-NeoX with attention_dropout and hidden_dropout 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from container.models import attention
from container.models.rope import apply_rope


def activation(name: str):
    """transformers' ACT2FN for GPT-NeoX's activations: exact GELU, or its tanh approximation
    (gelu_new, gelu_fast and gelu_pytorch_tanh are the same function)."""
    if name == "gelu":
        return F.gelu
    return lambda x: F.gelu(x, approximate="tanh")


class GPTNeoXAttention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.head_dim, self.init_std = args.head_dim, args.init_std
        self.wqkv = nn.Linear(args.dim, 3 * args.dim, bias=args.attention_bias)
        self.wo = nn.Linear(args.dim, args.dim, bias=args.attention_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # [B, S, heads, 3·d] -> q, k, v [B, heads, S, d]: the local heads under tensor parallelism
        qkv = self.wqkv(x).view(bsz, seq, -1, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention.sdpa(q, k, v, mask)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))

    def init_weights(self, std: float) -> None:
        nn.init.trunc_normal_(self.wqkv.weight, mean=0.0, std=self.init_std)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=std)
        for linear in (self.wqkv, self.wo):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)


class GPTNeoXMLP(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.init_std, self.act = args.init_std, activation(args.hidden_act)
        self.w1 = nn.Linear(args.dim, args.ffn_dim)  # dense_h_to_4h
        self.w2 = nn.Linear(args.ffn_dim, args.dim)  # dense_4h_to_h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x)))

    def init_weights(self, std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=self.init_std)
        nn.init.trunc_normal_(self.w2.weight, mean=0.0, std=std)
        for linear in (self.w1, self.w2):
            nn.init.zeros_(linear.bias)


class GPTNeoXBlock(nn.Module):
    def __init__(self, layer_id: int, args):
        super().__init__()
        self.parallel_residual = args.parallel_residual
        self.attention = GPTNeoXAttention(args)
        self.feed_forward = GPTNeoXMLP(args)
        self.attention_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)  # input_layernorm
        self.ffn_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)  # post_attention_layernorm
        self.depth_std = args.init_std / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        attended = self.attention(self.attention_norm(x), cos, sin, mask)
        if self.parallel_residual:  # transformers' order of the sum: mlp + attention + residual
            return self.feed_forward(self.ffn_norm(x)) + attended + x
        h = attended + x
        return self.feed_forward(self.ffn_norm(h)) + h

    @property
    def mlp(self) -> nn.Module:
        return self.feed_forward

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.depth_std)
        self.feed_forward.init_weights(self.depth_std)
