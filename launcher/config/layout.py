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


@dataclass(frozen=True)
class LayoutProblem:
    """A degree that does not fit the world: which SMP parameter, its value, what is wrong, the fix."""

    key: str
    value: int
    problem: str
    fix: str


def layout_problems(params: ModelParallelParameters, world: int) -> list[LayoutProblem]:
    """Every way `params` fails to tile `world` ranks into (dp_replicate, dp_shard, cp, tp): the one
    check, which the client's validation reports and the container's runtime enforces."""
    tp, cp = params.tensor_parallel_degree, params.context_parallel_degree
    problems = [LayoutProblem(key, degree, f"must divide the world size {world}", f"use one of {divisors(world)}")
                for key, degree in (("tensor_parallel_degree", tp), ("context_parallel_degree", cp),
                                    ("expert_parallel_degree", params.expert_parallel_degree))
                if degree > world or world % degree]
    hsd = params.hybrid_shard_degree
    if hsd and tp <= world and world % tp == 0:
        if hsd > world // tp:
            problems.append(LayoutProblem("hybrid_shard_degree", hsd, f"exceeds world / tensor_parallel_degree = "
                                          f"{world // tp}", f"use 0 (shard over all {world // tp}) or a divisor "
                                          f"of {world // tp}"))
        elif world % (hsd * tp):
            problems.append(LayoutProblem("hybrid_shard_degree", hsd, f"world {world} is not divisible by "
                                          f"hybrid_shard_degree x tp = {hsd * tp}", f"use one of {divisors(world // tp)}"))
    group = sharding_group(params, world)
    if cp > 1 and group % cp:
        problems.append(LayoutProblem("context_parallel_degree", cp,
                                      f"the sharding group ({group} ranks) is not a multiple of it; "
                                      "context-parallel ranks sit inside the sharding group",
                                      f"use a divisor of {group}, or raise hybrid_shard_degree"))
    sdp = params.sharded_data_parallel_degree
    dp = world // (tp * params.pipeline_degree) or 1
    if sdp and dp % sdp:
        problems.append(LayoutProblem("sharded_data_parallel_degree", sdp,
                                      f"must divide the data-parallel degree {dp}", f"use one of {divisors(dp)}"))
    return problems


def with_sharding_strategy(params: ModelParallelParameters, strategy: str | None,
                           processes_per_host: int) -> ModelParallelParameters:
    """The seed's FSDP1 `sharding_strategy` in SMP terms, where hybrid_shard_degree leaves it open:
    no_shard is a sharding group of 1; hybrid_shard shards within a host and replicates across.
    The runtime builds its mesh from this, and validation its layout, so the planner sizes it."""
    if params.hybrid_shard_degree or params.sharded_data_parallel_degree:
        return params
    if strategy == "no_shard":
        return params.model_copy(update={"hybrid_shard_degree": 1})
    if strategy in ("hybrid_shard", "_hybrid_shard_zero2"):
        return params.model_copy(update={
            "hybrid_shard_degree": max(processes_per_host // params.tensor_parallel_degree, 1)})
    return params


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
