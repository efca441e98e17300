"""SMP's rank arithmetic, shared by the client's checks and the container's DeviceMesh.

world = dp_replicate x sharding_group x tp, sharding_group = dp_shard x cp; the mesh is
(dp_replicate, dp_shard, cp, tp) with tp and cp innermost, and FSDP shards over dp_shard x cp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.config.distribution import ModelParallelParameters


@dataclass(frozen=True)
class ParallelLayout:
    world: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    ep: int = 1

    @property
    def sharding_group(self) -> int:
        return self.dp_shard * self.cp

    @property
    def data_parallel(self) -> int:
        """How many distinct batches one step consumes (world / (tp x cp))."""
        return self.dp_replicate * self.dp_shard

    @property
    def mesh_shape(self) -> tuple[int, int, int, int]:
        return (self.dp_replicate, self.dp_shard, self.cp, self.tp)

    mesh_dim_names = ("dp_replicate", "dp_shard", "cp", "tp")

    @classmethod
    def from_parameters(cls, params: ModelParallelParameters, world: int) -> ParallelLayout:
        """Layout of a *validated* config (rules.check_layout reports what would not divide)."""
        tp, cp = params.tensor_parallel_degree, params.context_parallel_degree
        group = sharding_group(params, world)
        return cls(
            world=world,
            dp_replicate=world // (tp * group),
            dp_shard=group // cp,
            cp=cp,
            tp=tp,
            ep=params.expert_parallel_degree,
        )


def sharding_group(params: ModelParallelParameters, world: int) -> int:
    """hybrid_shard_degree, else SMP v1's sharded_data_parallel_degree, else all of world / tp."""
    if params.hybrid_shard_degree:
        return params.hybrid_shard_degree
    if params.sharded_data_parallel_degree:
        return params.sharded_data_parallel_degree
    return max(world // params.tensor_parallel_degree, 1)


def divisors(n: int) -> list[int]:
    """The divisors of n in ascending order, found in sqrt(n) steps (n may be a world of a million
    ranks or a vocabulary of 2**31 entries)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
