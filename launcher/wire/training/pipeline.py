"""Pipeline parallelism's rules beyond the layout (layout.py checks that pp divides the world):
what the model, the batch and the schedule must allow for smlaunch's runtime to pipeline a job.

Written once: the client's validation reports them (rules.check_pipeline) and the container
refuses the same before it builds anything (container/distributed/pipeline.py). Pure, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.wire.training.layout import divisors
from launcher.wire.training.mp_parameters import ModelParallelParameters

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
