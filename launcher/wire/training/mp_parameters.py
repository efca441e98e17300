"""SMP's model-parallel parameters (`smdistributed.modelparallel.parameters`, sent as the
`mp_parameters` hyperparameter) with smlaunch's degrees: what the runtime's mesh is made of. Keys
and defaults follow SMP v2 and, for sharded data parallelism, SMP v1; see docs/smp.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from launcher.wire.training.base import FiniteNumber, Strict, WholeNumber
from launcher.wire.training.degrees import BY_KEY, model_with_degrees
from launcher.wire.training.limits import MAX_DIMENSION, MAX_WORLD

# The degrees' fields come from launcher.wire.training.degrees (one definition for every list of them).
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
