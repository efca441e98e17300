"""The parallel degrees, defined once: SMP's parameter, its mesh dimension, default and meaning.

Everything that lists degrees derives from `DEGREES`: the `distribution` fields
(`ModelParallelParameters`), the seed script's duplicate arguments (`TrainingHyperparameters`),
SDK v3's `SMP` shape, the planner's settings and abbreviations, `plan --auto`'s search keys and
what a resume may change (docs/architecture.md, "Where a new thing goes"). A new degree is one
entry here plus its `apply_*` module in container/distributed/ and its rule in layout.py.

SMP's model-parallel parameters (`smdistributed.modelparallel.parameters`, sent as the
`mp_parameters` hyperparameter) are made of them here too (`ModelParallelParameters`): what the
runtime's mesh is made of. Keys and defaults follow SMP v2 and, for sharded data parallelism, SMP
v1; see docs/smp.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, create_model

from launcher.wire.training.base import MAX_DIMENSION, MAX_WORLD, FiniteNumber, Strict, WholeNumber


@dataclass(frozen=True)
class Degree:
    key: str  # SMP's parameter name (mp_parameters, distribution, the planner's settings)
    short: str  # the mesh dimension's name; the planner's abbreviation
    default: int
    minimum: int
    description: str
    smp_v3: bool  # a field of SDK v3's SMP(...) (SMP v2's parameters; pipelines are SMP v1's)
    script_argument: bool  # the seed's script also takes it as an argument, which must agree
    searched: bool  # `plan --auto` searches it
    resharded: bool  # a resume may change it: its checkpoints are shown to reshard (launcher/wire/training/resume.py)
    alias: str | None = None  # an older SMP name; the larger of the two is in force

    def field(self, *, optional: bool = False, description: str | None = None) -> Any:
        """The pydantic field of this degree (optional: None unless set, e.g. a duplicate)."""
        return Field(None if optional else self.default, ge=self.minimum, le=MAX_WORLD,
                     description=description or self.description)

    def value(self, params: Any) -> int:
        """Its value in force in validated model-parallel parameters."""
        own = getattr(params, self.key)
        return max(own, getattr(params, self.alias) or 1) if self.alias else own

    def raw_value(self, mp: Mapping[str, Any]) -> Any:
        """Its value in a model-parallel dict that did not validate (best effort, for reports)."""
        own = mp.get(self.key)
        if own is None and self.alias:
            own = mp.get(self.alias)
        return self.default if own is None else own


DEGREES = (
    Degree("hybrid_shard_degree", "hsd", 0, 0,
           "FSDP sharding group size. 0: shard across all ranks (world / tp); 1: no sharding; >=2: shard "
           "within groups of this size and replicate across groups.",
           smp_v3=True, script_argument=True, searched=True, resharded=True),
    Degree("context_parallel_degree", "cp", 1, 1,
           "Split every sequence across this many ranks (inside the sharding group).",
           smp_v3=True, script_argument=True, searched=True, resharded=True),
    Degree("tensor_parallel_degree", "tp", 1, 1, "Megatron-style split of attention and MLP weights.",
           smp_v3=True, script_argument=True, searched=True, resharded=True),
    Degree("expert_parallel_degree", "ep", 1, 1,
           "Split MoE experts across ranks; only meaningful for MoE models.",
           smp_v3=True, script_argument=False, searched=False, resharded=True),
    Degree("pipeline_parallel_degree", "pp", 1, 1,
           "SMP v1: pipeline stages, each a consecutive slice of the layers (not with sharded data "
           "parallelism).",
           smp_v3=False, script_argument=False, searched=True, resharded=True,
           alias="partitions"),
)
BY_KEY = {d.key: d for d in DEGREES}
BY_SHORT = {d.short: d for d in DEGREES}
KEYS = tuple(BY_KEY)


def model_with_degrees(name: str, base: type, which: str = "all", *, kind: Any = int,
                       optional: bool = False, description: str | None = None) -> type:
    """A pydantic base class `name` deriving from `base` with one field per degree: every degree,
    or those of the SDK v3 `SMP` shape ("smp_v3"), or the seed script's arguments
    ("script_argument"); `optional` fields are None unless set."""
    chosen = [d for d in DEGREES if which == "all" or getattr(d, which)]
    return create_model(name, __base__=base, **{
        d.key: (kind | None if optional else kind, d.field(optional=optional, description=description))
        for d in chosen})


def by_short(**values: int) -> dict[str, int]:
    """Degrees named by their short names, by key: by_short(tp=2) == {"tensor_parallel_degree": 2}."""
    return {BY_SHORT[short].key: value for short, value in values.items()}


def settings(params: Any | None) -> dict[str, int]:
    """The degrees in force, by key (all defaults without model-parallel parameters)."""
    return {d.key: d.value(params) if params is not None else d.default for d in DEGREES}


def script_arguments(hp: Any) -> dict[str, int | None]:
    """The seed script's degree arguments of parsed hyperparameters (None where not given)."""
    return {d.key: getattr(hp, d.key) for d in DEGREES if d.script_argument}


# --- SMP's model-parallel parameters, with the degrees above --------------------------------------
# The degrees' fields come from DEGREES (one definition for every list of them).
_Degrees = model_with_degrees("_Degrees", Strict, kind=WholeNumber)


class ModelParallelParameters(_Degrees):
    # --- SMP v2 (and the degrees above) ---------------------------------------------------
    sm_activation_offloading: bool = Field(
        True, description="Offload checkpointed activations to host memory (needs activation checkpointing)."
    )
    activation_loading_horizon: WholeNumber = Field(
        2, ge=1, description="How many offloaded layers may be on the accelerator at once."
    )
    fsdp_cache_flush_warnings: bool = Field(
        True, description="Warn when the CUDA caching allocator flushes."
    )
    allow_empty_shards: bool = Field(
        False, description="Allow tensors that do not divide evenly by the shard count."
    )
    random_seed: WholeNumber | None = Field(None, description="Seed for tensor/expert-parallel random ops.")
    delayed_parameter_initialization: bool = Field(
        False, description="Create the model on the meta device, shard it, then initialise the shards."
    )
    # --- SMP v1 sharded data parallelism (mapped onto the same runtime concepts) ----------
    sharded_data_parallel_degree: WholeNumber | None = Field(
        None, ge=1, le=MAX_WORLD, description="SMP v1: sharding group size (same meaning as hybrid_shard_degree)."
    )
    sdp_reduce_bucket_size: WholeNumber = Field(
        500_000_000, ge=1, description="SMP v1: gradient reduce bucket size in elements."
    )
    sdp_param_persistence_threshold: WholeNumber = Field(
        1_000_000, ge=0, description="SMP v1: parameters smaller than this many elements stay unsharded."
    )
    sdp_max_live_parameters: WholeNumber = Field(
        1_000_000_000, ge=1, description="SMP v1: most parameters gathered at once (prefetch limit)."
    )
    sdp_hierarchical_allgather: bool = Field(
        True, description="SMP v1: all-gather within a node first, then across nodes."
    )
    sdp_gradient_clipping: FiniteNumber = Field(
        1.0, ge=0, description="SMP v1: clip the global gradient L2 norm to this value."
    )
    ddp: bool = Field(False, description="SMP v1: data parallelism on (required with sharded data parallelism).")
    bf16: bool = Field(False, description="SMP v1: train in bfloat16.")
    fp16: bool = Field(False, description="SMP v1: train in float16.")
    prescaled_batch: bool = Field(
        False, description="SMP v1: each tensor-parallel group reads one combined batch."
    )
    ddp_dist_backend: Literal["auto", "nccl"] = Field(
        "auto", description="SMP v1: collective backend for data parallelism."
    )
    partitions: WholeNumber | None = Field(
        None, ge=1, le=MAX_WORLD, description="SMP v1 alias of pipeline_parallel_degree."
    )
    microbatches: WholeNumber = Field(
        1, ge=1, le=MAX_DIMENSION, description="SMP v1: pipeline microbatches per step; each data-parallel "
        "rank's batch (train_batch_size x gradient_accumulation_steps sequences) is split into this many.",
    )
    pipeline: Literal["interleaved", "simple"] = Field(
        "interleaved", description="SMP v1: pipeline schedule; interleaved: forward and backward passes "
        "alternate (1F1B), simple: every forward pass, then every backward pass (GPipe).",
    )
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] | None = Field(
        None, description="smlaunch extension: the torch.distributed.pipelining schedule, overriding "
        "`pipeline`; interleaved_1f1b runs pipeline_virtual_stages stages per rank.",
    )
    pipeline_virtual_stages: WholeNumber = Field(
        1, ge=1, le=MAX_WORLD, description="smlaunch extension: pipeline stages per rank (2 or more with "
        "pipeline_schedule interleaved_1f1b, else 1).",
    )
    shard_optimizer_state: bool = Field(
        False, description="SMP v1: optimizer state sharding (not with sharded data parallelism)."
    )

    @property
    def pipeline_degree(self) -> int:
        return BY_KEY["pipeline_parallel_degree"].value(self)

    @property
    def schedule(self) -> str:
        """The pipeline schedule in force: pipeline_schedule, else SMP v1's `pipeline` by meaning."""
        return self.pipeline_schedule or ("gpipe" if self.pipeline == "simple" else "1f1b")

    def explicit(self) -> dict:
        """Only the keys the user wrote, for the wire format (`mp_parameters`)."""
        return self.model_dump(include=self.model_fields_set)
