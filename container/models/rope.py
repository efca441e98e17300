"""Rotary position embeddings in Hugging Face's rotate-half layout (so its q/k weights load as
they are), with Llama 3.1's frequency scaling, and partial rotation (GPT-NeoX's `rotary_pct`: the
first `rotary_dim` dimensions of each head turn, the rest pass through, as transformers does)."""

from __future__ import annotations

import math

import torch


def rope_inv_freq(args) -> torch.Tensor:
    """Inverse frequencies of the rotated dimensions (`args.rotary_dim`, else the whole head), with
    Llama 3.1's scaling of the low frequencies when configured. `args`: a TransformerArgs."""
    d = args.rotary_dim or args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if args.rope_scaling is None:
        return inv_freq.float()
    factor, low_ff, high_ff, original = args.rope_scaling
    low_wavelen, high_wavelen = original / low_ff, original / high_ff
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low_ff) / (high_ff - low_ff)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    scaled = torch.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return scaled.float()


def rope_tables(args, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position < max_seq_len: [max_seq_len, rotated dimensions] each."""
    positions = torch.arange(args.max_seq_len, dtype=torch.float32, device=device)
    freqs = torch.outer(positions, rope_inv_freq(args).to(device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, S, D]; cos/sin: [S, R] or [B, S, R] for the positions of x's tokens. The first R
    dimensions of each head are rotated (R = D: all of them), the others kept."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    rot = cos.shape[-1]
    turned, kept = (x, None) if rot == x.shape[-1] else (x[..., :rot], x[..., rot:])
    half = rot // 2
    rotated = torch.cat((-turned[..., half:], turned[..., :half]), dim=-1)
    out = (turned.float() * cos + rotated.float() * sin).to(x.dtype)
    return out if kept is None else torch.cat((out, kept), dim=-1)
