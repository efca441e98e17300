"""Mixtral's sparse mixture-of-experts block and its load-balancing auxiliary loss.

The block follows transformers' `MixtralSparseMoeBlock`: a router (`gate`, dim -> E, no bias),
softmax in fp32, top-k experts per token with their weights renormalised to sum to 1, SwiGLU
experts. The experts are stacked parameters [E, ...] in Hugging Face's per-expert orientation
(w1/w3 [E, I, D], w2 [E, D, I]), so expert parallelism shards dim 0 and `container.checkpoint.hf_export` maps
expert e to the Hub's `experts.e.w1.weight`. Dispatch is dropless: the (token, expert) pairs are
sorted by expert and each expert runs on its contiguous slice. Expert parallelism
(`container.distributed.expert_parallel`) moves those slices between ranks around `GroupedExperts`.

Routing: how many (token, expert) pairs each expert gets is a value, read back to the host to
split the rows (the experts' loop here, the all-to-all's splits under expert parallelism). `Routing`
takes those values from the router's choices; a traced step (container.trace.routing), whose fake
tensors have no values, assumes them even. The layers ask `routing()`, which is the run's unless a
trace has set its own (`routed_by`).

Auxiliary loss (docs/moe.md): Hugging Face's `load_balancing_loss_func` of ONE sequence, over all
layers jointly, summed over a rank's sequences here and averaged over the step's sequences by the
trainer. Per sequence it does not depend on how sequences are spread over ranks or micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor


class Routing:
    """The run's: each expert's count of (token, expert) pairs from the router's choices, and under
    expert parallelism each rank's counts exchanged with one all-to-all."""

    def counts(self, choices: torch.Tensor, num_experts: int) -> torch.Tensor:
        """[E] pairs per expert, from the flattened top-k choices."""
        return torch.bincount(choices, minlength=num_experts)

    def exchange(self, counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        """[ep * E/ep]: what each rank of `group` sends this rank for each of its local experts."""
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=group)
        return received

    def integers(self):
        """The context in which the counts' own arithmetic (splits, orders) runs."""
        return nullcontext()


_RUN_ROUTING = Routing()
_ROUTING: ContextVar[Routing | None] = ContextVar("smlaunch_moe_routing", default=None)


def routing() -> Routing:
    return _ROUTING.get() or _RUN_ROUTING


@contextmanager
def routed_by(chosen: Routing) -> Iterator[None]:
    token = _ROUTING.set(chosen)
    try:
        yield
    finally:
        _ROUTING.reset(token)


class GroupedExperts(nn.Module):
    """`num_experts` SwiGLU experts held as stacked weights (a DTensor sharded on dim 0 under
    expert parallelism; each rank then runs its own experts)."""

    def __init__(self, num_experts: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))  # gate
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))  # down
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim))  # up

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x: [N, D], rows grouped by expert, counts[e] rows for local expert e -> [N, D].
        A loop over experts: torch._grouped_mm has no CPU backward (torch 2.13)."""
        w1, w2, w3 = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w1, self.w2, self.w3))
        out = [F.linear(F.silu(F.linear(rows, w1[e])) * F.linear(rows, w3[e]), w2[e])
               for e, rows in enumerate(x.split(counts.tolist()))]
        return torch.cat(out)

    def init_weights(self, std: float, init_std: float = 0.02) -> None:
        nn.init.trunc_normal_(self.w1, mean=0.0, std=init_std)
        for weight in (self.w2, self.w3):
            nn.init.trunc_normal_(weight, mean=0.0, std=std)


@dataclass
class RouterStats:
    """One layer's routing of a micro-batch, per sequence: top-k assignments per expert (no
    gradient) and router probabilities summed per expert (differentiable), both [B, E]."""

    counts: torch.Tensor
    probs: torch.Tensor
    tokens: int  # tokens per sequence on this rank


class MoE(nn.Module):
    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, init_std: float = 0.02):
        super().__init__()
        self.num_experts, self.top_k, self.init_std = num_experts, top_k, init_std
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.experts = GroupedExperts(num_experts, dim, hidden)
        self.router_stats: RouterStats | None = None  # the last forward's, for load_balancing_sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, dim = x.shape
        tokens = x.reshape(-1, dim)
        probs = F.softmax(self.gate(tokens).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        self.router_stats = self._stats(probs, chosen, bsz, seq)
        flat = chosen.flatten()
        order = flat.argsort(stable=True)  # (token, expert) pairs grouped by expert, tokens in order
        rows = order // self.top_k
        out = self.experts(tokens[rows], routing().counts(flat, self.num_experts))
        # Hugging Face's order of operations: weight in fp32, cast, add up the experts from zero
        out = (out * weights.flatten()[order, None]).to(x.dtype)
        return torch.zeros_like(tokens).index_add_(0, rows, out).view(bsz, seq, dim)

    def _stats(self, probs: torch.Tensor, chosen: torch.Tensor, bsz: int, seq: int) -> RouterStats:
        with torch.no_grad():
            hits = F.one_hot(chosen, self.num_experts).view(bsz, -1, self.num_experts)
            counts = hits.sum(dim=1, dtype=torch.float32)
        return RouterStats(counts, probs.view(bsz, seq, -1).sum(dim=1), seq)

    def init_weights(self, std: float) -> None:
        nn.init.trunc_normal_(self.gate.weight, mean=0.0, std=self.init_std)
        self.experts.init_weights(std, self.init_std)


def discard_router_stats(model: nn.Module) -> None:
    """Forget the last forward's router statistics. After a backward that recomputed the blocks
    (activation checkpointing), they are the recomputation's, and their probabilities' graph holds
    each recomputed block's activations up to its router: dropped, so that graph does not live
    through the optimizer step (on Mixtral 8x7B at 8K tokens a rank, 21 GiB: docs/moe.md)."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.router_stats = None


def load_balancing_sum(model: nn.Module, cp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The sum over this rank's sequences of each sequence's load-balancing loss, from the router
    statistics of the model's last forward (taken, so a second call finds none).

    Per sequence, Hugging Face's formula over its T tokens and the L layers together:
        E · Σ_e (c_e / (L·T)) · (p_e / (L·T)),
    c_e the top-k assignments to expert e, p_e its router probabilities summed. Under context
    parallelism a sequence's tokens are on every rank of `cp_group`: c (no gradient) is summed over
    the group, and each rank's p covers its own tokens, so the ranks' results add up to the
    sequence's loss and its gradient.
    """
    stats = [m.router_stats for m in model.modules() if isinstance(m, MoE) and m.router_stats is not None]
    if not stats:
        raise RuntimeError("no router statistics: run the MoE model's forward first")
    discard_router_stats(model)
    counts = torch.stack([s.counts for s in stats]).sum(0)
    probs = torch.stack([s.probs for s in stats]).sum(0)
    rows = len(stats) * stats[0].tokens
    if cp_group is not None and dist.get_world_size(cp_group) > 1:
        dist.all_reduce(counts, group=cp_group)
        rows *= dist.get_world_size(cp_group)
    return counts.shape[-1] * ((counts / rows) * (probs / rows)).sum()
