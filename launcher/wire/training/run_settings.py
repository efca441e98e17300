"""Every decision the training runtime makes from a job's settings, made here once.

`run_settings(hyperparameters, model-parallel parameters, world)` is pure (no torch): the trainer
(container/trainer.py) runs what it returns, and the planner (launcher/plan/workload.py) sizes
the same thing, so a default changed here changes both. Defaults are those of the seed's SMP v2
training script, whose hyperparameter names the runtime takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.wire.training import data_order
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.hyperparameters import FP8Config, TrainingHyperparameters
from launcher.wire.training.models import DEFAULT_ATTENTION_KERNEL
from launcher.wire.training.nonfinite import DEFAULT_NONFINITE_MAX, FAIL
from launcher.wire.training.speed import DISABLED

DEFAULT_SEQ_LEN = 2048
DEFAULT_DATASET_TYPE = "jsonl"
DEFAULT_TRUNCATION_MODE = "keep_start"  # TRL's SFTConfig default: a long example keeps its start
DEFAULT_AC_MODE = "full"  # activation_checkpointing_mode when checkpointing is on
DEFAULT_MAX_STEPS = 100
DEFAULT_SEED = 12345
DEFAULT_LR, DEFAULT_MIN_LR = 1e-4, 1e-5
DEFAULT_WARMUP = 0.0032  # fraction of the decay steps
DEFAULT_WEIGHT_DECAY = 0.2
DEFAULT_BETAS = (0.9, 0.95)
DEFAULT_GRAD_CLIP = 1.0
DEFAULT_KEPT_CHECKPOINTS = 2
DEFAULT_MIN_NUM_PARAMS = 100_000_000  # size_based_auto_wrap_policy's threshold
# Tokens per cross-entropy chunk (container/loss.py): one chunk's fp32 logits and their gradients,
# 12 B x 2048 x 128,256 = 2.9 GiB for Llama 3, instead of 23.5 GiB for a 16K sequence; micro-batches
# of at most this many tokens are not chunked (nothing to save). bench/loss_memory.py measures it.
DEFAULT_LOSS_CHUNK_TOKENS = 2048
# FSDP1 strategies that keep parameters gathered between forward and backward (ZeRO-2)
NO_RESHARD_STRATEGIES = ("shard_grad_op", "_hybrid_shard_zero2")


@dataclass(frozen=True)
class RunSettings:
    """What one run does; the comment says which hyperparameter (or SMP parameter) decides it."""

    # data and steps
    seq_len: int  # max_context_width
    micro_batch: int  # train_batch_size: sequences per data-parallel rank per micro-batch
    grad_accum: int  # gradient_accumulation_steps
    max_steps: int
    seed: int
    dataset_type: str
    shuffle: bool  # shuffle, else on for indexed shards and chat examples (launcher.wire.training.data_order)
    data_mixture: tuple[tuple[str, float], ...]  # data_mixture: (channel, weight); (): the train channel
    truncation_mode: str  # truncation_mode: what a chat example longer than a row keeps (keep_start, keep_end, drop)
    val_batch: int  # val_batch_size
    validation_freq: int  # 0: never
    validation_batches: int | None  # None: the whole validation channel (the seed's -1)
    logging_freq: int
    checkpoint_freq: int  # 0: no checkpoints
    keep_checkpoints: int  # num_kept_checkpoints
    checkpoint_async_mode: str  # checkpoint_async_mode: disabled, async, async_with_pinned_mem
    nonfinite_policy: str  # nonfinite_policy: fail, skip or rollback (launcher.wire.training.nonfinite)
    nonfinite_max: int  # nonfinite_max: the non-finite steps skip or rollback tolerate in the run
    # optimizer and schedule
    optimizer: str  # "adamw" (fp32 moments) or "anyprecision" (bf16 moments, Kahan buffer)
    optimizer_implementation: str | None  # fused, foreach or for-loop; None: the device's default (speed.py)
    lr: float
    min_lr: float
    warmup_steps: int
    decay_steps: int  # lr_decay_iters
    lr_style: str  # lr_decay_style
    weight_decay: float
    betas: tuple[float, float]
    grad_clip: float  # grad_clip, else SMP v1's sdp_gradient_clipping, else 1.0
    # precision and memory
    bf16: bool  # bf16, or SMP v1's parameters.bf16
    fp8: FP8Config
    ac_mode: str | None  # activation_checkpointing(_mode): None, "full", "selective" or "selective_op"
    ac_freq: int  # activation_checkpointing_freq: every N-th block is checkpointed (1: all)
    offload: bool  # checkpointed block inputs to host memory (offload_activations, sm_activation_offloading)
    offload_horizon: int  # activation_loading_horizon
    compile: bool  # compile: torch.compile of each block and of the loss (container.distributed.compile)
    delayed_init: bool  # delayed_param / delayed_parameter_initialization: meta-device init
    loss_chunk_tokens: int  # loss_chunk_tokens: cross-entropy over chunks of this many tokens; 0: whole logits
    document_masking: bool  # document_masking: records' documents attend only within themselves (docs/data.md)
    attention_kernel: str  # attention_kernel: what attends within documents (launcher.wire.training.models)
    clean_cache: bool  # clean_cache: empty the CUDA caching allocator after each step (AWS's script's)
    # sharding
    fsdp: bool  # FSDP2 applied: more than one rank, or bf16 (its mixed-precision policy)
    reshard_after_forward: bool  # False for the ZeRO-2 sharding strategies
    wrap_policy: str  # auto_wrap_policy
    min_num_params: int
    persistence_threshold: int  # SMP v1 sharded data parallel only; else 0
    max_live_parameters: int | None  # SMP v1 sharded data parallel only
    cp_comm_type: str  # Transformer Engine's context-parallel exchange

    @property
    def compute_bytes(self) -> int:
        """Bytes per parameter and activation in compute (FSDP2's param_dtype; no fp16 path)."""
        return 2 if self.bf16 else 4


def run_settings(hp: TrainingHyperparameters, params: ModelParallelParameters | None, world: int) -> RunSettings:
    """The run `hp` and `params` describe on `world` ranks (unset values take the defaults above)."""
    params = params if params is not None else ModelParallelParameters()
    max_steps = hp.max_steps or DEFAULT_MAX_STEPS
    decay = hp.lr_decay_iters or max_steps
    bf16 = bool(hp.bf16 or params.bf16)  # SMP v1 jobs switch bf16 on in the parameters
    sdp = bool(params.sharded_data_parallel_degree)  # SMP v1 settings apply with SMP v1 sharding
    ac_mode = (hp.activation_checkpointing_mode or DEFAULT_AC_MODE) if hp.activation_checkpointing else None
    sm_offload = "sm_activation_offloading" in params.model_fields_set and params.sm_activation_offloading
    return RunSettings(
        seq_len=hp.max_context_width or DEFAULT_SEQ_LEN,
        micro_batch=hp.train_batch_size or 1,
        grad_accum=hp.gradient_accumulation_steps or 1,
        max_steps=max_steps,
        seed=hp.seed if hp.seed is not None else DEFAULT_SEED,
        dataset_type=hp.dataset_type or DEFAULT_DATASET_TYPE,
        shuffle=data_order.shuffled(hp.dataset_type or DEFAULT_DATASET_TYPE, hp.shuffle),
        data_mixture=_mixture(hp.data_mixture),
        truncation_mode=hp.truncation_mode or DEFAULT_TRUNCATION_MODE,
        val_batch=hp.val_batch_size or 1,
        validation_freq=hp.validation_freq or 0,
        validation_batches=hp.validation_batches if hp.validation_batches and hp.validation_batches > 0 else None,
        logging_freq=hp.logging_freq or 1,
        checkpoint_freq=hp.checkpoint_freq or 0,
        keep_checkpoints=hp.num_kept_checkpoints or DEFAULT_KEPT_CHECKPOINTS,
        checkpoint_async_mode=hp.checkpoint_async_mode or DISABLED,
        nonfinite_policy=hp.nonfinite_policy or FAIL,
        nonfinite_max=hp.nonfinite_max or DEFAULT_NONFINITE_MAX,
        optimizer=hp.optimizer or "adamw",
        optimizer_implementation=hp.optimizer_implementation,
        lr=hp.lr or DEFAULT_LR,
        min_lr=hp.min_lr if hp.min_lr is not None else DEFAULT_MIN_LR,
        warmup_steps=int((hp.warmup if hp.warmup is not None else DEFAULT_WARMUP) * decay),
        decay_steps=decay,
        lr_style=hp.lr_decay_style or "cosine",
        weight_decay=hp.weight_decay if hp.weight_decay is not None else DEFAULT_WEIGHT_DECAY,
        betas=(hp.beta1 or DEFAULT_BETAS[0], hp.beta2 or DEFAULT_BETAS[1]),
        grad_clip=hp.grad_clip if hp.grad_clip is not None else (
            params.sdp_gradient_clipping if sdp else DEFAULT_GRAD_CLIP),
        bf16=bf16,
        fp8=FP8Config.from_hyperparameters(hp),
        ac_mode=ac_mode,
        ac_freq=hp.activation_checkpointing_freq or 1,
        offload=ac_mode is not None and bool(hp.offload_activations or sm_offload),
        offload_horizon=max(1, params.activation_loading_horizon),
        compile=bool(hp.compile),
        delayed_init=bool(hp.delayed_param or params.delayed_parameter_initialization),
        loss_chunk_tokens=hp.loss_chunk_tokens if hp.loss_chunk_tokens is not None else DEFAULT_LOSS_CHUNK_TOKENS,
        document_masking=hp.document_masking is not False,
        attention_kernel=hp.attention_kernel or DEFAULT_ATTENTION_KERNEL,
        clean_cache=bool(hp.clean_cache),
        fsdp=world > 1 or bf16,
        reshard_after_forward=(hp.sharding_strategy or "full_shard") not in NO_RESHARD_STRATEGIES,
        wrap_policy=hp.auto_wrap_policy or "transformer_auto_wrap_policy",
        min_num_params=hp.min_num_params or DEFAULT_MIN_NUM_PARAMS,
        persistence_threshold=params.sdp_param_persistence_threshold if sdp else 0,
        max_live_parameters=params.sdp_max_live_parameters if sdp else None,
        cp_comm_type=hp.cp_comm_type or "p2p",
    )


def _mixture(text: str | None) -> tuple[tuple[str, float], ...]:
    """data_mixture's pairs; a malformed one is validation's error and the container's before it
    builds anything (data_order.mixture_issues), so none here."""
    try:
        return data_order.parse_mixture(text)
    except data_order.MixtureError:
        return ()
