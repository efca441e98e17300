"""Expert parallelism: each MoE layer's experts split over `expert_parallel_degree` ranks.

The ep group is carved from the ranks that hold distinct tokens inside the FSDP sharding group
(dp_shard x cp, torchtitan's "dp_shard_in_ep"): the sharding group's flattened view is unflattened
into (efsdp, ep), ep innermost, so ep peers are the nearest ranks. The stacked expert weights
become DTensors sharded on dim 0 over ep (each rank holds E / ep experts); FSDP2 then shards
them over efsdp (and replicates over dp_replicate), while the dense weights shard over the whole
group as before (`parallelize.apply_fsdp`). Gradients stay SUM-reduced: an expert's gradient
collects every rank's tokens through the all-to-all's backward, then FSDP sums it over the ranks
that hold the same experts, so every layout equals one process.

Token dispatch is dropless: a rank's (token, expert) pairs, already grouped by expert, go to the
rank holding their expert with one all-to-all (uneven splits; the counts travel first), are
regrouped by local expert, run, and come back with the inverse permutation and a second
all-to-all. Both are torch's autograd all-to-all (functional collectives), so backward is the
same exchange reversed.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _set_pg_timeout
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

from container.distributed.runtime import Runtime, refuse
from container.models.moe import GroupedExperts, routing
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.layout import moe_problems

log = logging.getLogger("smlaunch")


def expert_meshes(rt: Runtime) -> tuple[DeviceMesh, DeviceMesh]:
    """(ep mesh, the mesh FSDP shards the experts over): the sharding group split into
    (efsdp, ep), beside dp_replicate for hybrid sharding. The layout rules (launcher.wire.training.layout)
    have made sure ep divides the sharding group."""
    ep, group = rt.layout.ep, rt.layout.sharding_group
    mesh = rt.fsdp_mesh._unflatten("dp_shard_cp", (group // ep, ep), ("efsdp", "ep"))
    fsdp = mesh["dp_replicate", "efsdp"] if rt.layout.dp_replicate > 1 else mesh["efsdp"]
    for name in ("efsdp", "ep"):  # the runtime's collective timeout, like every group of its mesh
        _set_pg_timeout(rt.collective_timeout, mesh.get_group(name))
    return mesh["ep"], fsdp


class _Dispatcher:
    """input_fn/output_fn of one experts module: tokens to the experts' ranks and back."""

    def __init__(self):
        self.splits: tuple[list[int], list[int]] = ([], [])
        self.order = torch.empty(0)

    def dispatch(self, module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        rows, counts = inputs  # rows grouped by expert; counts[e] for each of the E experts
        ep, group, routed = mesh.size(), mesh.get_group(), routing()
        received = routed.exchange(counts, group)
        with routed.integers():
            received = received.view(ep, -1)  # [source rank, local expert]
            send = counts.view(ep, -1).sum(1).tolist()
            recv = received.sum(1).tolist()
            self.order, local = _expert_major(received), received.sum(0)
        rows = all_to_all_single_autograd(rows, recv, send, group)
        self.splits = (send, recv)
        return rows[self.order], local

    def combine(self, module: nn.Module, out: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        send, recv = self.splits
        back = out[torch.argsort(self.order)]  # source-major again, as the rows arrived
        return all_to_all_single_autograd(back, send, recv, mesh.get_group())


def _expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Indices that reorder rows laid out [source][expert] (counts[s, e] rows each) into
    [expert][source] order."""
    flat = counts.reshape(-1)
    starts = (flat.cumsum(0) - flat).view_as(counts).t().reshape(-1)  # each block's start, expert-major
    sizes = counts.t().reshape(-1)
    placed = sizes.cumsum(0) - sizes  # where each block starts once reordered
    return torch.arange(int(flat.sum()), device=counts.device) + torch.repeat_interleave(starts - placed, sizes)


def _shard_experts(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
    if isinstance(module, GroupedExperts):
        for key, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(key, nn.Parameter(distribute_tensor(param, mesh, [Shard(0)])))


def check_moe_layout(params: ModelParallelParameters, num_experts: int) -> None:
    """A job built by hand fails here, before any work, with validation's own check."""
    refuse(moe_problems(params, num_experts))


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard every MoE layer's experts over `ep_mesh` and route its tokens with all-to-all."""
    experts = expert_modules(model)
    for module in experts:
        dispatcher = _Dispatcher()
        distribute_module(module, ep_mesh, _shard_experts, input_fn=dispatcher.dispatch,
                          output_fn=dispatcher.combine)
    log.info("applied expert parallelism to %d MoE layers over %d ranks", len(experts), ep_mesh.size())


def expert_modules(model: nn.Module) -> list[nn.Module]:
    """The experts modules, which FSDP shards over their own mesh under expert parallelism."""
    return [m for m in model.modules() if isinstance(m, GroupedExperts)]
