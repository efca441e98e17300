"""A traced step's MoE routing: even, because fake tensors have no values to route by.

A run's MoE layers split their rows by how many (token, expert) pairs the router gave each expert
(container.models.moe.Routing): values read back to the host, which a fake tensor does not have.
A traced step assumes the planner's balanced routing instead: of a rank's n pairs, expert e gets
n // E, one more for the first n % E experts, and under expert parallelism every rank sends the
same counts (every rank holds a micro-batch of the same shape). The collectives are issued as in a
run (the counts' all-to-all, then the rows'), so the trace counts them; only the counts' values
are the assumption's. What routing skew would add to a rank's peak is not traced (docs/planner.md).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily

from container.models.moe import Routing


class EvenRouting(Routing):
    def counts(self, choices: torch.Tensor, num_experts: int) -> torch.Tensor:
        pairs = choices.numel()
        with unset_fake_temporarily():  # real values, which the layer reads back
            return torch.tensor([pairs // num_experts + (e < pairs % num_experts) for e in range(num_experts)])

    def exchange(self, counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        super().exchange(counts, group)  # the collective a run issues; a fake group returns no values
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        with unset_fake_temporarily():
            return counts.view(ep, -1)[rank].repeat(ep)  # every source sends this rank's experts the same

    def integers(self):
        return unset_fake_temporarily()  # the counts' arithmetic on their real values
