"""What the training runtime will do with a validated job, as plain numbers for the planner.

The decisions are the trainer's own (launcher.wire.training.run_settings, which container/trainer.py
runs), so the memory and throughput models size THIS runtime, not a generic one.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.config import ValidatedJob
from launcher.config.job_rules import resolve_path
from launcher.wire.datafiles import TRAIN_CHANNELS
from launcher.wire.megatron_index import MegatronHeader
from launcher.wire.megatron_index import length_buckets as megatron_lengths
from launcher.wire.token_shards import ShardError, read_header, shard_indexes
from launcher.wire.training import data_order
from launcher.wire.training.catalog import InstanceType
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.flops import attended_length
from launcher.wire.training.layout import ParallelLayout, bubble_fraction, in_flight_microbatches
from launcher.wire.training.lora import LoraSettings, kind_shape, lora_settings
from launcher.wire.training.models import ModelSpec, vocab_rows


class PlanError(ValueError):
    """A job the planner cannot size (unknown model or world size); the message says what to set."""


class UnmodeledScript(PlanError):
    """A script of the user's own that does not say its model: nothing to plan, and no error in the
    job (the script may build any model); the message says how to describe it."""


RUNTIME_PROGRAM = ("smlaunch's runtime (entrypoints/train.py): FSDP2 per block, the chunked cross-entropy, "
                   "its activation checkpointing and attention")
# the calibration runs (docs/planner.md) were eager: nothing measured says what compile changes
COMPILED = ("; compile=1 is priced as the eager run (torch.compile's speed-up and memory are not modelled: "
            "docs/planner.md)")
SCRIPT_PROGRAM = ("AWS's SMP v2 reference program for your script: FSDP over the whole model, the whole fp32 "
                  "logits in the loss, activation checkpointing as its hyperparameter says; what your script "
                  "does differently is not in these figures")


# LoRA's state is modelled (docs/planner.md); what its adapters keep for backward is not yet
LORA_ACTIVATIONS = ("; use_peft=1: the frozen base without gradients or optimizer state, the adapters' (and the "
                    "modules trained whole) with them; activations as the full fine-tune's (each adapter's dropped "
                    "input kept for backward is not modelled yet, docs/lora.md)")
QLORA_BASE = ("; load_in_4bit=1: the blocks' linear weights in NF4, sharded and all-gathered, and one weight's "
              "dequantization at a time (docs/lora.md)")


def modeled_program(job: ValidatedJob) -> str:
    """What the plan models, for its first line (docs/own-scripts.md)."""
    if job.kind.runtime:
        hp = job.config.hyperparameters
        return (RUNTIME_PROGRAM + (COMPILED if job.settings.compile else "") + (LORA_ACTIVATIONS if hp.use_peft else "")
                + (QLORA_BASE if hp.use_peft and hp.load_in_4bit else ""))
    sdp = job.config.distribution.parameters.sharded_data_parallel_degree if job.config.distribution else None
    if sdp:  # an SMP v1 job: its sharding group is the layout's shard degree (wire.training.layout)
        return (f"{SCRIPT_PROGRAM}; SMP v1's sharded data parallelism (MiCS) as SMP v2's hybrid sharding, "
                f"parameters sharded over groups of sharded_data_parallel_degree = {sdp} GPUs")
    return SCRIPT_PROGRAM


@dataclass(frozen=True)
class Workload:
    spec: ModelSpec
    seq_len: int  # max_context_width
    micro_batch: int  # train_batch_size: sequences per data-parallel rank per micro-batch
    grad_accum: int
    layout: ParallelLayout
    compute_bytes: int  # 2 with bf16 (FSDP2 param_dtype bf16), 4 in fp32 (the runtime has no fp16 path)
    fsdp: bool  # the runtime applies FSDP2 when world > 1 or bf16
    ac_mode: str | None  # None, "full", "selective" or "selective_op"
    offload: bool  # checkpointed block inputs live in host memory
    offload_horizon: int  # activation_loading_horizon
    reshard_after_forward: bool  # False for shard_grad_op / _hybrid_shard_zero2
    delayed_init: bool  # meta-device init: the full model never exists on a GPU
    optimizer: str  # "adamw" (fp32 moments) or "anyprecision" (bf16 moments + Kahan buffer)
    fp8: bool
    fp8_backend: str  # "transformer_engine" or "torchao"
    cp_comm_type: str  # Transformer Engine's context-parallel exchange: p2p, all_gather or a2a
    loss_chunk_tokens: int  # the cross-entropy runs over chunks of this many tokens; 0: the whole logits
    microbatches: int  # pipeline microbatches per step (1 without pipeline parallelism)
    in_flight: int  # pipeline microbatches whose activations a stage holds at once (1 without)
    bubble: float  # the pipeline schedule's idle fraction of a step (0 without)
    instance: InstanceType | None
    instance_count: int
    processes_per_host: int
    # the length each token's attention spans: seq_len, or with document masking the documents'
    # (launcher.wire.training.flops.attended_length) where the shards' headers say their lengths
    attended: float | None = None
    attended_basis: str | None = None  # where `attended` comes from, for the report
    ac_freq: int = 1  # activation_checkpointing_freq: every ac_freq-th block is checkpointed
    lora: LoraSettings | None = None  # adapters on a frozen base (use_peft), or None: the whole model trains

    @property
    def checkpointed_layers(self) -> int:
        """How many of a stage's layers checkpointing wraps (container.distributed.parallelize.checkpointed_blocks)."""
        return 0 if self.ac_mode is None else self.spec.num_layers // self.layout.pp // self.ac_freq

    @property
    def attention_len(self) -> float:
        return self.seq_len if self.attended is None else self.attended

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank holds per micro-batch: its 1/cp of every sequence of its micro-batch.
        Under pipeline parallelism a forward is one pipeline microbatch: the data-parallel rank's
        micro_batch x grad_accum sequences over `microbatches`."""
        if self.layout.pp > 1:
            return self.micro_batch * self.grad_accum // self.microbatches * self.seq_len // self.layout.cp
        return self.micro_batch * self.seq_len // self.layout.cp

    @property
    def logits_tokens(self) -> int:
        """Tokens whose logits exist at once on a rank: one loss chunk (container/loss.py), or the
        whole micro-batch when it is not chunked (loss_chunk_tokens 0, or no more tokens than that)."""
        chunk = self.loss_chunk_tokens
        return chunk if 0 < chunk < self.tokens_per_rank else self.tokens_per_rank

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step consumes across the job."""
        return self.micro_batch * self.seq_len * self.grad_accum * self.layout.data_parallel

    @property
    def world(self) -> int:
        return self.layout.world


def adapter_parameters(spec: ModelSpec, lora: LoraSettings | None) -> int:
    """One block's LoRA parameters: A [r, in] and B [out, r] for each targeted linear layer."""
    return 0 if lora is None else lora.r * sum(sum(kind_shape(spec, kind)) for kind in lora.targets)


def allocated_model(spec: ModelSpec, tp: int) -> ModelSpec:
    """The model as smlaunch's runtime allocates and computes it: the embedding's and head's rows
    padded where tensor parallelism does not split the vocabulary (launcher.wire.training.models.vocab_rows;
    a resume's saved rows are not known to a plan)."""
    return replace(spec, vocab_size=vocab_rows(spec.vocab_size, tp))


def workload_of(job: ValidatedJob) -> Workload:
    """The runtime's view of `job`; PlanError when the model or world size is unknown."""
    if job.model is None and not job.kind.runtime:
        raise UnmodeledScript("this script does not say its model, so there is nothing to plan: describe it with "
                              "hyperparameters model_type (llama_v3, llama_v2, mistral, mixtral, gpt_neox) and "
                              "hidden_width, num_layers, num_heads, intermediate_size, vocab_size, or with "
                              "hf_pretrained_model_name_or_dir (a directory or Hub id with config.json)")
    if job.model is None:
        raise PlanError("the model is unknown: set hyperparameters.model_preset (llama3.2-1b, llama3.1-8b, ...) "
                        "or hf_pretrained_model_name_or_dir to a known name or a directory with config.json")
    if job.layout is None or job.processes_per_host is None:
        raise PlanError("the world size is only known where the job runs (local_gpu): set processes_per_host")
    lay = job.layout
    if min(lay.mesh_shape) < 1 or math.prod(lay.mesh_shape) != lay.world:  # a job not built by validate_job
        raise PlanError(f"the mesh {dict(zip(lay.mesh_dim_names, lay.mesh_shape))} does not tile the world of "
                        f"{lay.world} ranks: run `smlaunch validate` on the job for what to change")
    s = job.settings
    params = job.config.distribution.parameters if job.config.distribution else ModelParallelParameters()
    return Workload(
        spec=allocated_model(job.model, lay.tp) if job.kind.runtime else job.model,
        seq_len=s.seq_len,
        micro_batch=s.micro_batch,
        grad_accum=s.grad_accum,
        layout=job.layout,
        compute_bytes=s.compute_bytes,
        fsdp=s.fsdp,
        ac_mode=s.ac_mode,
        ac_freq=s.ac_freq,
        offload=s.offload,
        offload_horizon=s.offload_horizon,
        reshard_after_forward=s.reshard_after_forward,
        delayed_init=s.delayed_init,
        optimizer=s.optimizer,
        # validation's FP8 decision: the same function as run_settings' for smlaunch's runtime, and
        # for a user script (whose fp8_* values pass unchecked) the switch alone
        fp8=job.fp8.enabled,
        fp8_backend=job.fp8.backend,
        cp_comm_type=s.cp_comm_type,
        # a script of the user's own is planned as AWS's SMP v2 program, whose loss takes the whole logits
        loss_chunk_tokens=s.loss_chunk_tokens if job.kind.runtime else 0,
        microbatches=params.microbatches if lay.pp > 1 else 1,
        in_flight=in_flight_microbatches(params.schedule, lay.pp, params.microbatches) if lay.pp > 1 else 1,
        bubble=bubble_fraction(params.schedule, lay.pp, params.microbatches, params.pipeline_virtual_stages),
        instance=job.instance,
        instance_count=job.config.instance_count,
        processes_per_host=job.processes_per_host,
        **dict(zip(("attended", "attended_basis"), documents_attention(job, s.seq_len))),
        lora=lora_settings(job.config.hyperparameters, job.model) if job.kind.runtime else None,
    )


# `smlaunch plan --data DIR`: a local copy of the training data's shards, read in place of the job's
# channels (an S3 channel's headers are not read from here); set for the command's duration.
documents_from: ContextVar[Path | None] = ContextVar("documents_from", default=None)


def documents_attention(job: ValidatedJob, seq_len: int) -> tuple[float | None, str | None]:
    """With document masking on indexed channels this machine can read (the job's local channels,
    or `documents_from`): (the documents' mean attention length per token, what it is read from);
    (None, None) otherwise: causal rows."""
    s = job.settings
    if not (job.kind.runtime and s.document_masking and s.dataset_type == data_order.INDEXED):
        return None, None
    channels = job.config.channels()
    names = [name for name, _ in s.data_mixture] or [next((n for n in TRAIN_CHANNELS if n in channels), "train")]
    weights = {names[0]: 1.0}
    if s.data_mixture:  # shares, not the weights: weights of 1e308 would sum to inf
        weights = dict(zip(names, data_order.shares([w for _, w in s.data_mixture])))
    if documents_from.get() is not None:  # one local copy stands for the training data
        names, weights = [str(documents_from.get())], {str(documents_from.get()): 1.0}
    lengths = []
    for name in names:
        uri = name if documents_from.get() is not None else channels[name].s3_data if name in channels else None
        if uri is None or uri.startswith("s3://"):
            return None, None  # only the container sees an S3 channel
        try:
            headers = [read_header(idx) for idx in shard_indexes(resolve_path(job.base_dir, uri))]
        except ShardError:
            return None, None  # validation reports the damaged shard
        buckets = [row for h in headers for row in (megatron_lengths(h) if isinstance(h, MegatronHeader)
                                                    else h.fields.get("lengths", {}).get("buckets", []))]
        found = attended_length(buckets, seq_len)
        if found is None:
            return None, None
        lengths.append((weights[name], found))
    total = sum(w for w, _ in lengths)
    attended = sum(w * a for w, a in lengths) / total
    return attended, (f"the documents of the shards in {', '.join(names)} attend {attended:,.0f} tokens "
                      f"per token on average with document masking, {attended / seq_len:.1%} of a causal row of "
                      f"{seq_len:,}")
