"""SMP's rank arithmetic, shared by the client's checks and the container's DeviceMesh.

world = pp x dp_replicate x sharding_group x tp, sharding_group = dp_shard x cp; the mesh is
(pp, dp_replicate, dp_shard, cp, tp) with pp outermost and tp and cp innermost, and FSDP shards
over dp_shard x cp within each pipeline stage: every pipeline stage is a layout of world / pp
ranks, built like the whole world is without pipeline parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.wire.training.mp_parameters import ModelParallelParameters


@dataclass(frozen=True)
class ParallelLayout:
    world: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    ep: int = 1
    pp: int = 1

    @property
    def sharding_group(self) -> int:
        return self.dp_shard * self.cp

    @property
    def data_parallel(self) -> int:
        """How many distinct batches one step consumes (world / (pp x tp x cp))."""
        return self.dp_replicate * self.dp_shard

    @property
    def mesh_shape(self) -> tuple[int, int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    mesh_dim_names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

    @classmethod
    def from_parameters(cls, params: ModelParallelParameters, world: int) -> ParallelLayout:
        """Layout of a *validated* config (rules.check_layout reports what would not divide)."""
        tp, cp, pp = params.tensor_parallel_degree, params.context_parallel_degree, params.pipeline_degree
        group = sharding_group(params, world)
        return cls(
            world=world,
            dp_replicate=world // (pp * tp * group),
            dp_shard=group // cp,
            cp=cp,
            tp=tp,
            ep=params.expert_parallel_degree,
            pp=pp,
        )


@dataclass(frozen=True)
class LayoutProblem:
    """A degree that does not fit the world: which SMP parameter, its value, what is wrong, the fix."""

    key: str
    value: int
    problem: str
    fix: str


def layout_problems(params: ModelParallelParameters, world: int) -> list[LayoutProblem]:
    """Every way `params` fails to tile `world` ranks into (pp, dp_replicate, dp_shard, cp, tp): the
    one check, which the client's validation reports and the container's runtime enforces."""
    pp = params.pipeline_degree
    if pp > world or world % pp:
        key = "partitions" if (params.partitions or 1) > params.pipeline_parallel_degree else "pipeline_parallel_degree"
        return [LayoutProblem(key, pp, f"must divide the world size {world}", f"use one of {divisors(world)}")]
    # every pipeline stage is a layout of world / pp ranks
    return _stage_problems(params, world // pp, "world" if pp == 1 else "world / pipeline_parallel_degree")


def _stage_problems(params: ModelParallelParameters, ranks: int, name: str) -> list[LayoutProblem]:
    """What keeps `params` from tiling one pipeline stage's `ranks` (`name`: the world, or world / pp)
    into (dp_replicate, dp_shard, cp, tp)."""
    where = f"the world size {ranks}" if name == "world" else f"{name} = {ranks}"
    tp, cp = params.tensor_parallel_degree, params.context_parallel_degree
    problems = [LayoutProblem(key, degree, f"must divide {where}", f"use one of {divisors(ranks)}")
                for key, degree in (("tensor_parallel_degree", tp), ("context_parallel_degree", cp),
                                    ("expert_parallel_degree", params.expert_parallel_degree))
                if degree > ranks or ranks % degree]
    hsd = params.hybrid_shard_degree
    if hsd and tp <= ranks and ranks % tp == 0:
        if hsd > ranks // tp:
            problems.append(LayoutProblem("hybrid_shard_degree", hsd, f"exceeds {name} / tensor_parallel_degree "
                                          f"= {ranks // tp}", f"use 0 (shard over all {ranks // tp}) or a divisor "
                                          f"of {ranks // tp}"))
        elif ranks % (hsd * tp):
            problems.append(LayoutProblem("hybrid_shard_degree", hsd, f"{name} {ranks} is not divisible by "
                                          f"hybrid_shard_degree x tp = {hsd * tp}",
                                          f"use one of {divisors(ranks // tp)}"))
    group = _stage_sharding_group(params, ranks)
    if cp > 1 and group % cp:
        problems.append(LayoutProblem("context_parallel_degree", cp,
                                      f"the sharding group ({group} ranks) is not a multiple of it; "
                                      "context-parallel ranks sit inside the sharding group",
                                      f"use a divisor of {group}, or raise hybrid_shard_degree"))
    ep = params.expert_parallel_degree
    if ep > 1 and ranks % ep == 0 and group % ep:
        problems.append(LayoutProblem("expert_parallel_degree", ep,
                                      f"does not divide the sharding group ({group} ranks); expert-parallel "
                                      "ranks sit inside the sharding group (dp_shard x cp)",
                                      f"use one of {divisors(group)}, or raise hybrid_shard_degree"))
    sdp = params.sharded_data_parallel_degree
    dp = ranks // tp or 1
    if sdp and dp % sdp:
        problems.append(LayoutProblem("sharded_data_parallel_degree", sdp,
                                      f"must divide the data-parallel degree {dp}", f"use one of {divisors(dp)}"))
    return problems


def moe_problems(params: ModelParallelParameters, num_experts: int) -> list[LayoutProblem]:
    """What smlaunch's runtime needs of the layout for a model of `num_experts` experts (0: dense):
    expert parallelism only for an MoE model, over a divisor of its experts; no tensor parallelism
    of the MoE layers (pipeline parallelism: launcher.wire.training.pipeline). Validation reports these
    and the runtime refuses them (container.distributed.expert_parallel)."""
    ep, tp = params.expert_parallel_degree, params.tensor_parallel_degree
    if not num_experts:
        return [LayoutProblem("expert_parallel_degree", ep, "expert parallelism needs a mixture-of-experts "
                              "model, and the model is dense", "set expert_parallel_degree: 1")] if ep > 1 else []
    problems = []
    if num_experts % ep:
        problems.append(LayoutProblem("expert_parallel_degree", ep, f"does not divide the model's {num_experts} "
                                      "experts", f"use one of {divisors(num_experts)}"))
    if tp > 1:
        problems.append(LayoutProblem("tensor_parallel_degree", tp, "the runtime's MoE layers have no tensor "
                                      "parallelism", "set tensor_parallel_degree: 1 and split the experts with "
                                      "expert_parallel_degree"))
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
    """hybrid_shard_degree, else SMP v1's sharded_data_parallel_degree, else all of world / (pp x tp)."""
    return _stage_sharding_group(params, world // params.pipeline_degree)


def _stage_sharding_group(params: ModelParallelParameters, stage_ranks: int) -> int:
    if params.hybrid_shard_degree:
        return params.hybrid_shard_degree
    if params.sharded_data_parallel_degree:
        return params.sharded_data_parallel_degree
    return max(stage_ranks // params.tensor_parallel_degree, 1)


def divisors(n: int) -> list[int]:
    """The divisors of n in ascending order, found in sqrt(n) steps (n may be a world of a million
    ranks or a vocabulary of 2**31 entries)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
