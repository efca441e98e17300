"""SMP's rank arithmetic, shared by the client's checks and the container's DeviceMesh.

world = pp x dp_replicate x sharding_group x tp, sharding_group = dp_shard x cp; the mesh is
(pp, dp_replicate, dp_shard, cp, tp) with pp outermost and tp and cp innermost, and FSDP shards
over dp_shard x cp within each pipeline stage: every pipeline stage is a layout of world / pp
ranks, built like the whole world is without pipeline parallelism.

Pipeline parallelism's rules beyond the layout are here too (`pipeline_problems`, the stages and
schedules): what the model, the batch and the schedule must allow for smlaunch's runtime to
pipeline a job. Written once: the client's validation reports them (rules.check_pipeline) and the
container refuses the same before it builds anything (container/distributed/pipeline.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.wire.training.degrees import ModelParallelParameters


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
    of the MoE layers (pipeline parallelism: launcher.wire.training.layout). Validation reports these
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


# --- pipeline parallelism beyond the layout: the model, the batch, the schedule -------------------
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
# SMP v1's `pipeline` values, by the torch schedule that does the same
SMP_V1_SCHEDULES = {"simple": "gpipe", "interleaved": "1f1b"}


@dataclass(frozen=True)
class PipelineProblem:
    """What keeps a job from being pipelined: the SMP parameter (or, with `hyperparameter`, the
    hyperparameter) at fault, its value, what is wrong, the fix."""

    key: str
    value: object
    problem: str
    fix: str
    hyperparameter: bool = False


@dataclass(frozen=True)
class PipelineJob:
    """What the rules need to know of the job besides its parameters (None: not known yet)."""

    num_layers: int | None = None
    batch_per_rank: int | None = None  # train_batch_size x gradient_accumulation_steps sequences
    tied_embeddings: bool = False
    moe: bool = False
    fp8: bool = False
    delayed_init: bool = False
    pretrained_weights: bool = False
    validation: bool = False


def num_stages(params: ModelParallelParameters) -> int:
    """Pipeline stages in all: pipeline_parallel_degree x stages per rank."""
    return params.pipeline_degree * params.pipeline_virtual_stages


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The consecutive layer ids pipeline stage `stage` of `stages` holds (the layer count divides)."""
    per = num_layers // stages
    return range(stage * per, (stage + 1) * per)


def in_flight_microbatches(schedule: str, pp: int, microbatches: int) -> int:
    """Microbatches whose activations the first stage holds at once: GPipe runs every forward
    before any backward; 1F1B starts backward after pp forwards (interleaved 1F1B about as many;
    its warm-up adds under one more per rank)."""
    return microbatches if schedule == "gpipe" else min(pp, microbatches)


def bubble_fraction(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """The schedule's theoretical idle fraction of a step, with equal stages and no communication
    time: (pp - 1) / (m + pp - 1) for GPipe and 1F1B (each stage waits pp - 1 microbatch slots to
    fill and to drain the pipeline), (pp - 1) / (v·m + pp - 1) for interleaved 1F1B, whose slots
    are v times shorter (Narayanan et al. 2021, Megatron-LM's interleaved schedule)."""
    if pp == 1:
        return 0.0
    v = virtual_stages if schedule == "interleaved_1f1b" else 1
    return (pp - 1) / (v * microbatches + pp - 1)


def pipeline_problems(params: ModelParallelParameters, job: PipelineJob) -> list[PipelineProblem]:
    pp, virtual, schedule = params.pipeline_degree, params.pipeline_virtual_stages, params.schedule
    problems = _schedule_problems(params)
    if params.partitions and "pipeline_parallel_degree" in params.model_fields_set \
            and params.partitions != params.pipeline_parallel_degree:
        problems.append(PipelineProblem("partitions", params.partitions, "is SMP v1's name for "
                                        f"pipeline_parallel_degree, which says {params.pipeline_parallel_degree}",
                                        "set only one of them"))
    if pp == 1:
        return problems
    m = params.microbatches
    if m < pp:
        problems.append(PipelineProblem("microbatches", m, f"is fewer than the {pp} pipeline stages, which would "
                                        "leave stages idle for the whole step", f"use microbatches >= {pp}"))
    elif schedule == "interleaved_1f1b" and m % max(1, m // pp):
        rounds = m // pp
        problems.append(PipelineProblem("microbatches", m, f"interleaved 1F1B runs microbatches in rounds of "
                                        f"{m // rounds}, and {m} is not a multiple of its {rounds} rounds",
                                        f"use a multiple of pipeline_parallel_degree {pp}"))
    if job.batch_per_rank is not None and job.batch_per_rank % m:
        problems.append(PipelineProblem("microbatches", m, f"must divide each data-parallel rank's batch of "
                                        f"{job.batch_per_rank} sequences (train_batch_size x "
                                        "gradient_accumulation_steps)", f"use one of {divisors(job.batch_per_rank)}"))
    stages = pp * virtual
    if job.num_layers is not None and job.num_layers % stages:
        problems.append(PipelineProblem("pipeline_parallel_degree", pp,
                                        f"x pipeline_virtual_stages {virtual} makes {stages} stages, which do not "
                                        f"divide the model's {job.num_layers} layers", "use stages that divide "
                                        f"{job.num_layers} (one of {divisors(job.num_layers)})"))
    # (on, key, is a hyperparameter, problem, fix)
    refused = [(job.tied_embeddings, "pipeline_parallel_degree", False, ("the model ties its output layer to its "
                "embedding, and the first stage holds the embedding, the last the output layer"),
                "use a model with untied embeddings, or pipeline_parallel_degree 1"),
               (job.moe, "pipeline_parallel_degree", False, ("mixture-of-experts models are not pipelined yet "
                "(their load-balancing loss spans every layer)"), "use pipeline_parallel_degree 1"),
               (job.fp8, "fp8", True, "FP8 is not combined with pipeline parallelism here",
                "set fp8: 0, or pipeline_parallel_degree 1"),
               (job.delayed_init, "delayed_param", True, ("delayed parameter initialisation is not combined "
                "with pipeline parallelism here (stages are cut from a model initialised on every rank)"),
                "set delayed_param: 0 (and delayed_parameter_initialization: false)"),
               (job.pretrained_weights, "hf_pretrained_model_name_or_dir", True,
                "loading pretrained weights into pipeline stages is not supported yet",
                "set pipeline_parallel_degree 1, or init_from_scratch: 1"),
               (job.validation, "validation_freq", True, "validation does not run under pipeline parallelism yet",
                "remove validation_freq, or set pipeline_parallel_degree 1")]
    problems += [PipelineProblem(key, True if hyper else pp, problem, fix, hyperparameter=hyper)
                 for on, key, hyper, problem, fix in refused if on]
    return problems


def _schedule_problems(params: ModelParallelParameters) -> list[PipelineProblem]:
    pp, virtual, chosen = params.pipeline_degree, params.pipeline_virtual_stages, params.pipeline_schedule
    problems = []
    if chosen and "pipeline" in params.model_fields_set and SMP_V1_SCHEDULES[params.pipeline] != chosen:
        problems.append(PipelineProblem("pipeline_schedule", chosen, f"contradicts SMP v1's pipeline "
                                        f"{params.pipeline!r} ({SMP_V1_SCHEDULES[params.pipeline]})",
                                        "set only one of them"))
    if pp == 1 and (chosen or virtual > 1):
        key, value = ("pipeline_schedule", chosen) if chosen else ("pipeline_virtual_stages", virtual)
        problems.append(PipelineProblem(key, value, "means nothing without pipeline parallelism",
                                        "set pipeline_parallel_degree >= 2, or remove it"))
    elif params.schedule == "interleaved_1f1b" and virtual < 2:
        problems.append(PipelineProblem("pipeline_virtual_stages", virtual, "interleaved_1f1b runs several "
                                        "stages per rank", "set pipeline_virtual_stages >= 2"))
    elif params.schedule != "interleaved_1f1b" and virtual > 1:
        problems.append(PipelineProblem("pipeline_virtual_stages", virtual, f"the {params.schedule} schedule "
                                        "runs one stage per rank", "set pipeline_schedule: interleaved_1f1b, "
                                        "or pipeline_virtual_stages: 1"))
    return problems
