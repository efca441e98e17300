"""Llama 3 (RMSNorm, RoPE with Llama 3.1 frequency scaling, grouped-query attention, SwiGLU);
with `sliding_window`, Mistral (each query attends to the latest keys only); with `n_experts`,
Mixtral (each block's MLP a sparse mixture of experts, container.models.moe). With family
"gpt_neox" the blocks are GPT-NeoX's (container.models.gpt_neox) around the same embedding,
final norm (a LayerNorm) and head, so every parallelism, checkpoint and the pipeline's stages
treat both families alike.

Module names follow torchtitan (`tok_embeddings`, `layers.<i>.attention.wq`, ...); checkpoint
names map to Hugging Face's in `container.checkpoint.hf_export`. RoPE uses Hugging Face's rotate-half layout, so HF
weights load without permuting q/k. `init_weights` follows torchtitan (depth-scaled output
projections) and works on a model materialised from the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from container import loss
from container.models import attention
from container.models.gpt_neox import GPTNeoXBlock
from container.models.moe import MoE
from container.models.rope import apply_rope, rope_inv_freq, rope_tables
from launcher.wire.training.models import ModelSpec

__all__ = ["Transformer", "TransformerArgs", "build_model", "rope_inv_freq", "rope_tables", "apply_rope"]


@dataclass(frozen=True)
class TransformerArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 500_000.0
    rope_scaling: tuple[float, float, float, int] | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    explicit_head_dim: int | None = None  # config.json's head_dim where it is not dim / n_heads
    n_experts: int = 0  # > 0: every block's MLP is a Mixtral MoE of this many ffn_dim experts
    experts_per_token: int = 2
    sliding_window: int | None = None  # Mistral: a query sees itself and the window - 1 keys before it
    init_std: float = 0.02  # the spec's initializer_range
    # GPT-NeoX (family "gpt_neox"): RoPE on the first rotary_dim dimensions of each head, GELU MLP
    # (hidden_act), attention and MLP side by side (parallel_residual), biased attention projections
    family: str = "llama"
    rotary_dim: int | None = None  # None: the whole head
    hidden_act: str = "silu"
    parallel_residual: bool = False
    attention_bias: bool = False
    # rows of the embedding and head: vocab_size, or more where tensor parallelism pads the
    # vocabulary (launcher.wire.training.models.vocab_rows); 0: vocab_size
    padded_vocab: int = 0

    @classmethod
    def from_spec(cls, spec: ModelSpec, max_seq_len: int, vocab_rows: int | None = None) -> TransformerArgs:
        return cls(dim=spec.hidden_size, n_layers=spec.num_layers, n_heads=spec.num_heads,
                   n_kv_heads=spec.num_kv_heads, vocab_size=spec.vocab_size, ffn_dim=spec.intermediate_size,
                   max_seq_len=max_seq_len, rope_theta=spec.rope_theta, rope_scaling=spec.rope_scaling,
                   norm_eps=spec.norm_eps, tie_embeddings=spec.tie_embeddings,
                   explicit_head_dim=spec.explicit_head_dim, n_experts=spec.num_experts,
                   experts_per_token=spec.experts_per_token, sliding_window=spec.sliding_window,
                   init_std=spec.initializer_range, family="gpt_neox" if spec.is_gpt_neox else "llama",
                   rotary_dim=spec.rotary_dim if spec.rotary_dim != spec.head_dim else None,
                   hidden_act=spec.hidden_act, parallel_residual=spec.parallel_residual,
                   attention_bias=spec.attention_bias, padded_vocab=vocab_rows or 0)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.dim // self.n_heads

    @property
    def vocab_rows(self) -> int:
        return self.padded_vocab or self.vocab_size


class RMSNorm(nn.Module):
    """Hugging Face's Llama RMSNorm: normalise in fp32, scale in the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.window, self.init_std = args.sliding_window, args.init_std
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention.sdpa(q, k, v, mask, window=self.window)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))

    def init_weights(self, std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=self.init_std)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=std)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, init_std: float = 0.02):
        super().__init__()
        self.init_std = init_std
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=self.init_std)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: TransformerArgs):
        super().__init__()
        self.attention = Attention(args)
        if args.n_experts:  # its own name, so checkpoints and parallelisms tell the two apart
            self.moe = MoE(args.dim, args.ffn_dim, args.n_experts, args.experts_per_token, args.init_std)
        else:
            self.feed_forward = FeedForward(args.dim, args.ffn_dim, args.init_std)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.depth_std = args.init_std / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return h + self.mlp(self.ffn_norm(h))

    @property
    def mlp(self) -> nn.Module:
        return self.moe if hasattr(self, "moe") else self.feed_forward

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.depth_std)
        self.mlp.init_weights(self.depth_std)


class Transformer(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_rows, args.dim)
        block = GPTNeoXBlock if args.family == "gpt_neox" else TransformerBlock
        self.layers = nn.ModuleDict({str(i): block(i, args) for i in range(args.n_layers)})
        self.norm = nn.LayerNorm(args.dim, eps=args.norm_eps) if args.family == "gpt_neox" else (
            RMSNorm(args.dim, args.norm_eps))
        self.output = nn.Linear(args.dim, args.vocab_rows, bias=False)
        if args.vocab_rows > args.vocab_size:
            # the padding rows' logits: -inf, so they never win and take no probability (0 where real);
            # on the head, so the loss (container.loss) finds it, and tensor parallelism shards it with the logits
            self.output.register_buffer("vocab_mask", vocab_mask(args), persistent=False)
        self.tie_weights()
        # Not persistent: recomputed on init, never checkpointed.
        cos, sin = rope_tables(args)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, loss_chunk_tokens: int = 0,
                documents: torch.Tensor | None = None):
        """tokens: [B, S] -> logits [B, S, V]. `positions` ([S] or [B, S]) default to 0..S-1;
        context parallelism passes the global positions of a rank's chunks, a packed row the
        positions within each document. `documents` [B, S] (each token's document in its row):
        attention stays within each document (attention.document_mask). With `labels` [B, S]:
        (summed token loss, label token count) instead, the loss computed `loss_chunk_tokens`
        tokens at a time (container.loss; 0: the whole logits).

        A pipeline stage (container.distributed.pipeline) lacks what other stages hold: without
        `tok_embeddings`, `tokens` are the previous stage's hidden states; without `output`, the
        hidden states are returned for the next stage (and `labels` ignored)."""
        if positions is None:
            cos, sin = self.rope_cos[: tokens.shape[1]], self.rope_sin[: tokens.shape[1]]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        mask = attention.mask_for(documents, self.args.sliding_window)
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, cos, sin, mask)
        if self.output is None:
            return h
        h = self.norm(h)
        if labels is None:
            logits = loss.masked_logits(self.output, h)
            # the vocabulary's logits; a vocabulary-sharded DTensor keeps its padding, masked
            return logits if isinstance(logits, DTensor) else logits[..., :self.args.vocab_size]
        return loss.head_loss(self.output, h, labels, loss_chunk_tokens), loss.label_tokens(labels)

    def tie_weights(self) -> None:
        """With tied embeddings the head's weight is the embedding's parameter: at construction,
        and again after `to_empty` from the meta device, which replaces each module's meta
        parameter with a tensor of its own and so would leave the two untied."""
        if self.args.tie_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Recompute the RoPE tables (after `to_empty` from the meta device they hold garbage)."""
        cos, sin = rope_tables(self.args, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        mask = getattr(self.output, "vocab_mask", None)
        if mask is not None:
            full = vocab_mask(self.args, device=mask.device)
            if isinstance(mask, DTensor):  # split over tp like the logits (tensor_parallel.apply_tp)
                full = distribute_tensor(full, mask.device_mesh, mask.placements)
            mask.copy_(full)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and buffer (also after `to_empty` from the meta device)."""
        self.init_buffers()
        # the vocabulary's rows only, so a padded model draws the same numbers as an unpadded one
        # (one process, another degree); padding rows are zero
        vocab = self.args.vocab_size
        self.tok_embeddings.weight[vocab:].zero_()
        nn.init.normal_(self.tok_embeddings.weight[:vocab])
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        if not self.args.tie_embeddings:
            bound = 3 * self.args.dim**-0.5
            self.output.weight[vocab:].zero_()
            nn.init.trunc_normal_(self.output.weight[:vocab], mean=0.0, std=self.args.dim**-0.5, a=-bound, b=bound)

    def num_params(self, exclude_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.tok_embeddings.weight.numel() if exclude_embedding else n


def vocab_mask(args: TransformerArgs, device: torch.device | str | None = None) -> torch.Tensor:
    """[vocab_rows]: 0 for the vocabulary's logits, -inf for the padding's."""
    mask = torch.zeros(args.vocab_rows, device=device)
    mask[args.vocab_size:] = float("-inf")
    return mask


def build_model(spec: ModelSpec, max_seq_len: int, device: torch.device | str = "cpu",
                vocab_rows: int | None = None) -> Transformer:
    with torch.device(device):
        return Transformer(TransformerArgs.from_spec(spec, max_seq_len, vocab_rows))
