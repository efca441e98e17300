"""The training script's hyperparameters that smlaunch understands and cross-checks.

Names follow the seed's SMP v2 Llama script (`train.py` of AWS's SMP examples) so its
hyperparameter dicts work unchanged. Other keys pass through to the user's script untouched;
a key one typo away from a known one earns a warning.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from launcher.wire.training.base import MAX_DIMENSION, HyperparameterName, JsonValue, Strict, reject_boolean
from launcher.wire.training.data_order import DATASET_TYPES
from launcher.wire.training.degrees import model_with_degrees
from launcher.wire.training.lora import LoraHyperparameters
from launcher.wire.training.models import ATTENTION_KERNELS
from launcher.wire.training.nonfinite import DEFAULT_NONFINITE_MAX, NONFINITE_POLICIES
from launcher.wire.training.speed import (
    AC_MODES,
    ASYNC_MODES,
    FP8_RECIPES,
    OPTIMIZER_IMPLEMENTATIONS,
    default_fp8_backend,
)

SHARDING_STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "_hybrid_shard_zero2", "no_shard")
# Long enough for rank 0 to load a large pretrained model while the others wait; short enough
# that a rank left alone in a collective fails within minutes, not torch's 30 (gloo).
COLLECTIVE_TIMEOUT_DEFAULT_S = 600
# The step watchdog (container/resilience/step_watch.py, docs/faults.md "Hangs"). Initialization
# (after a Hub download, which has its own bound) must cover loading a large model and resuming its
# checkpoint: a 70B model is ~140 GB of bf16 weights read by rank 0 and broadcast, and at resume
# each rank's share of the checkpoint hashed and read; at 0.2-1 GB/s that is 3 to 12 minutes, and
# the first step compiles. 30 minutes leaves room for slow file systems; torchtitan's 300 s does not.
INIT_TIMEOUT_DEFAULT_S = 1800
# Without a step_timeout, a step may take max(floor, multiple x the median step so far): ten times
# the median is no straggler or GC pause, and the floor keeps sub-second steps from tripping on a
# slow data read or a tracker's network call (torchtitan's fixed 100 s is about 10 x a 10 s step).
STEP_TIMEOUT_FLOOR_S = 60
STEP_TIMEOUT_MEDIANS = 10
# The directories smlaunch's train.py takes as arguments besides its hyperparameters (container/args.py).
DIRECTORY_ARGUMENTS = ("model_dir", "output_data_dir", "checkpoint_dir", "training_dir", "test_dir",
                       "tensorboard_dir")
# Choices smlaunch's train.py makes; a user script may mean anything by these keys (job_kind.py).
RUNTIME_CHOICES = ("fp8_recipe", "fp8_amax_compute_algo", "fp8_backend", "activation_checkpointing_mode",
                   "optimizer", "optimizer_implementation", "dataset_type", "sharding_strategy", "auto_wrap_policy",
                   "backward_fetch_policy",
                   "cp_comm_type", "distributed_backend", "lr_decay_style", "attention_kernel", "shuffle",
                   "data_mixture", "truncation_mode", "rope_scaling_type", "moe_load_balancing",
                   "checkpoint_async_mode", "nonfinite_policy", "lora_target_modules", "lora_modules_to_save")


# The degrees the seed's script also accepts as arguments (launcher.wire.training.degrees); they must
# match the distribution's.
_SeedDegrees = model_with_degrees("_SeedDegrees", BaseModel, "script_argument", optional=True,
                                  description="Must match the distribution.")


class TrainingHyperparameters(_SeedDegrees, LoraHyperparameters):
    """Known hyperparameters, typed; unset ones are None (the script's default applies). LoRA's are
    declared with their rules (launcher.wire.training.lora)."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    # Keys smlaunch does not know pass to the script; the wire json.dumps them, so JSON values only.
    __pydantic_extra__: dict[HyperparameterName, JsonValue]
    # The values as the user wrote them: the wire carries these, because scripts parse their own
    # types (AWS's SMP script reads `--fp8 1` with type=int; a typed `true` would break it).
    _raw: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw(cls, data, handler):
        model = handler(data)
        if isinstance(data, dict):
            model._raw = {str(k): v for k, v in data.items() if v is not None}
        elif isinstance(data, TrainingHyperparameters):
            model._raw = dict(data._raw)
        return model

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value, info: ValidationInfo):
        return reject_boolean(value, cls.model_fields[info.field_name].annotation)

    @field_validator("profile_steps", "memory_snapshot_steps", mode="before")
    @classmethod
    def _one_step_may_be_a_number(cls, value):
        """`profile_steps: 5` in YAML is the window 5 (the wire carries it as text anyway)."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    def raw(self) -> dict:
        """The hyperparameters exactly as given (unset ones left out), for the wire format."""
        return dict(self._raw)

    # precision
    bf16: bool | None = Field(None, description="Train in bfloat16 mixed precision.")
    fp16: bool | None = Field(None, description="Train in float16 mixed precision.")
    fp8: bool | None = Field(None, description="FP8 matmuls (Transformer Engine or torchao).")
    fp8_recipe: Literal[FP8_RECIPES] | None = Field(
        None, description="FP8 scaling recipe: delayed or current (Transformer Engine), tensorwise or rowwise "
                          "(torchao; current means tensorwise there); docs/smp.md.")
    fp8_amax_history_len: int | None = Field(None, ge=1, description="Delayed scaling amax history length.")
    fp8_amax_compute_algo: Literal["max", "most_recent"] | None = Field(
        None, description="How the amax is taken from its history."
    )
    fp8_margin: int | None = Field(None, ge=0, description="FP8 scaling margin (powers of two).")
    fp8_backend: Literal["transformer_engine", "torchao"] | None = Field(None, description="FP8 library.")
    fp8_emulate: bool | None = Field(
        None, description="Allow FP8 without FP8 hardware (emulated; for tests on CPU)."
    )
    # memory
    activation_checkpointing: bool | None = Field(None, description="Recompute activations in backward.")
    activation_checkpointing_mode: Literal[AC_MODES] | None = Field(
        None, description="full: recompute whole blocks; selective: keep matmul/attention outputs; selective_op: "
                          "torchtitan's op policy (keep attention and every other matmul output)."
    )
    activation_checkpointing_freq: int | None = Field(
        None, ge=1, le=MAX_DIMENSION,
        description="smlaunch: checkpoint every N-th block only (torchtitan's layer-selective AC; default 1: "
                    "every block); the others keep all their activations."
    )
    gradient_accumulation_steps: int | None = Field(
        None, ge=1, le=MAX_DIMENSION, description="Micro-batches per step."
    )
    optimizer: Literal["adamw", "anyprecision"] | None = Field(
        None, description="adamw, or anyprecision (pure-bf16 states with Kahan-compensated updates)."
    )
    optimizer_implementation: Literal[OPTIMIZER_IMPLEMENTATIONS] | None = Field(
        None, description="smlaunch: how adamw runs (torchtitan's optimizer.implementation): fused (one kernel "
                          "for every parameter; the default on CUDA), foreach (a few multi-tensor kernels) or "
                          "for-loop (one parameter at a time; the default elsewhere, and anyprecision's only "
                          "one); docs/smp.md."
    )
    dataset_type: Literal[DATASET_TYPES] | None = Field(
        None, description="Training data: jsonl (records, the default), indexed (token shards of pack "
                          "--format indexed, memory-mapped), chat (messages or prompt/completion records, "
                          "tokenized with the model's chat template, loss on the answers) or synthetic; "
                          "docs/data.md."
    )
    shuffle: bool | None = Field(
        None, description="smlaunch: shuffle the samples with the seed, every epoch anew (default: on for "
                          "indexed token shards and chat examples; JSON Lines channels are read in order)."
    )
    truncation_mode: Literal["keep_start", "keep_end", "drop"] | None = Field(
        None, description="smlaunch: a chat example longer than max_context_width keeps its first tokens "
                          "(keep_start, the default), its last (keep_end), or is dropped (drop); docs/data.md."
    )
    data_mixture: str | None = Field(
        None, description='smlaunch: train on several indexed channels with weights, e.g. "web:0.7,code:0.3" '
                          "(input channels of those names; default: the train channel alone)."
    )
    document_masking: bool | None = Field(
        None, description="smlaunch: where records mark their documents (position_ids restarting at 0), "
                          "attention stays within each document and RoPE positions restart (default on; "
                          "0: packed documents see each other, as the seed's script trains; docs/data.md)."
    )
    attention_kernel: Literal[ATTENTION_KERNELS] | None = Field(
        None, description="smlaunch: the kernel that attends within documents: auto (FlexAttention on GPUs, "
                          "the dense mask on CPUs), dense, flex, or varlen (flash attention, bf16 on GPUs); "
                          "docs/data.md."
    )
    offload_activations: bool | None = Field(None, description="Offload checkpointed activations to host.")
    compile: bool | None = Field(
        None, description="smlaunch: torch.compile each transformer block and the loss (torchtitan's compile; "
                          "default off); the first step compiles (~30 s to minutes); docs/smp.md."
    )
    loss_chunk_tokens: int | None = Field(
        None, ge=0, le=MAX_DIMENSION,
        description="smlaunch: the cross-entropy runs over chunks of this many tokens, so a micro-batch's "
                    "whole fp32 logits never exist (0: the whole logits at once; unset: smlaunch's default "
                    "chunk, see docs/smp.md)."
    )
    delayed_param: bool | None = Field(None, description="Meta-device init (seed's spelling).")
    clean_cache: bool | None = Field(None, description="Empty the CUDA cache between steps.")
    enable_memory_profiling: bool | None = Field(None, description="Log memory statistics.")
    # FSDP
    sharding_strategy: Literal[SHARDING_STRATEGIES] | None = Field(None, description="FSDP sharding strategy.")
    auto_wrap_policy: Literal["transformer_auto_wrap_policy", "size_based_auto_wrap_policy"] | None = Field(
        None, description="Which modules FSDP wraps."
    )
    min_num_params: int | None = Field(None, ge=1, description="size_based_auto_wrap_policy threshold.")
    backward_fetch_policy: Literal["backward_pre", "backward_post"] | None = Field(
        None, description="FSDP backward prefetch."
    )
    forward_prefetch: bool | None = Field(None, description="FSDP forward prefetch.")
    limit_all_gathers: bool | None = Field(None, description="Rate-limit FSDP all-gathers.")
    # parallelism: the seed's script also takes some degrees as arguments (_SeedDegrees above)
    cp_comm_type: Literal["p2p", "all_gather", "a2a"] | None = Field(
        None, description="Transformer Engine context-parallel communication."
    )
    distributed_backend: Literal["nccl", "gloo", "smddp"] | None = Field(
        None, description="torch.distributed backend."
    )
    use_smp_implementation: bool | None = Field(None, description="Use SMP's model implementation.")
    use_smp_flash_attn: bool | None = Field(None, description="Use SMP's flash attention.")
    # model
    model_type: str | None = Field(None, description="Model family (llama_v2, llama_v3, mixtral, ...).")
    model_preset: str | None = Field(None, description="smlaunch model preset (llama3-tiny, llama3.1-8b, ...).")
    hf_pretrained_model_name_or_dir: str | None = Field(
        None, description="Pretrained weights: a directory, an input channel's name, or a Hub id org/name[@revision]."
    )
    init_from_scratch: bool | None = Field(
        None, description="Take only the architecture from hf_pretrained_model_name_or_dir; random weights."
    )
    tokenizer: str | None = Field(
        None, description="Tokenizer shipped in model.tar.gz, and the one dataset_type chat tokenizes with: a "
        "directory, a channel's name or a Hub id (default: the pretrained model's)."
    )
    max_context_width: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Sequence length in tokens.")
    vocab_size: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Vocabulary size.")
    hidden_width: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Model width.")
    num_layers: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Transformer blocks.")
    num_heads: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Attention heads.")
    num_key_value_heads: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Key/value heads (GQA).")
    intermediate_size: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="MLP width.")
    llama_intermediate_size: int | None = Field(
        None, ge=1, le=MAX_DIMENSION, description="MLP width (AWS's SMP script's name)."
    )
    rotary_emb_base: FiniteFloat | None = Field(None, gt=0, description="RoPE base (theta) of a model_type model.")
    rotary_pct: FiniteFloat | None = Field(
        None, gt=0, le=1, description="GPT-NeoX: the fraction of each attention head RoPE rotates (default 0.25).")
    rope_scaling_type: Literal["default", "llama3"] | None = Field(
        None, description="Llama: llama3 scales RoPE's low frequencies as Llama 3.1 does (rope_scaling_* factors).")
    rope_scaling_factor: FiniteFloat | None = Field(None, gt=0, description="llama3 RoPE scaling factor (8).")
    rope_scaling_low_freq_factor: FiniteFloat | None = Field(None, gt=0, description="llama3 RoPE: 1.")
    rope_scaling_high_freq_factor: FiniteFloat | None = Field(None, gt=0, description="llama3 RoPE: 4.")
    rope_scaling_original_max_position_embeddings: int | None = Field(
        None, ge=1, le=MAX_DIMENSION, description="llama3 RoPE: the pretraining context (8192).")
    sliding_window: int | None = Field(
        None, ge=1, le=MAX_DIMENSION, description="Mistral, Mixtral: each token attends to this many latest tokens, "
                                                  "itself included (default: the whole context).")
    initializer_range: FiniteFloat | None = Field(
        None, gt=0, description="Standard deviation of the projections' random initialisation (0.02).")
    moe: bool | None = Field(None, description="Mixture-of-experts model.")
    num_local_experts: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Experts per MoE layer.")
    num_experts_per_tok: int | None = Field(
        None, ge=1, le=MAX_DIMENSION, description="Experts each token visits (1 to num_local_experts; default 2).")
    router_aux_loss_coef: FiniteFloat | None = Field(
        None, ge=0, description="Weight of the MoE load-balancing loss in the training loss (Mixtral: 0.001).")
    moe_load_balancing: Literal["sinkhorn", "balanced", "aux_loss", "none"] | None = Field(
        None, description="MoE router balancing: aux_loss (the load-balancing loss, router_aux_loss_coef) or none; "
                          "SMP's sinkhorn and balanced are refused by smlaunch's train.py.")
    # training loop
    train_batch_size: int | None = Field(
        None, ge=1, le=MAX_DIMENSION, description="Sequences per data-parallel rank per step."
    )
    val_batch_size: int | None = Field(None, ge=1, le=MAX_DIMENSION, description="Validation sequences per rank.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps.")
    epochs: int | None = Field(None, ge=1, description="Passes over the data.")
    lr: FiniteFloat | None = Field(None, gt=0, description="Peak learning rate.")
    min_lr: FiniteFloat | None = Field(None, ge=0, description="Final learning rate.")
    lr_decay_style: Literal["cosine", "linear", "constant"] | None = Field(
        None, description="Learning-rate decay."
    )
    lr_decay_iters: int | None = Field(None, ge=1, description="Steps of learning-rate decay.")
    warmup: FiniteFloat | None = Field(None, ge=0, description="Warm-up fraction of lr_decay_iters.")
    plateau: FiniteFloat | None = Field(None, ge=0, description="Plateau fraction.")
    beta1: FiniteFloat | None = Field(None, ge=0, lt=1, description="Adam beta1.")
    beta2: FiniteFloat | None = Field(None, ge=0, lt=1, description="Adam beta2.")
    weight_decay: FiniteFloat | None = Field(None, ge=0, description="AdamW weight decay.")
    grad_clip: FiniteFloat | None = Field(None, ge=0, description="Gradient norm clipping.")
    seed: int | None = Field(None, description="Random seed.")
    do_train: bool | None = Field(None, description="Run training.")
    do_eval: bool | None = Field(None, description="Run evaluation.")
    validation_freq: int | None = Field(None, ge=1, description="Validate every N steps.")
    validation_batches: int | None = Field(None, description="Validation batches (-1: all).")
    fast_validation: bool | None = Field(None, description="Validate on a subset.")
    logging_freq: int | None = Field(None, ge=1, description="Log every N steps.")
    checkpoint_dir: str | None = Field(None, description="Where checkpoints are written.")
    tensorboard_dir: str | None = Field(
        None, description="Where rank 0 writes TensorBoard scalars (default: tensorboard_output_config's "
                          "container_local_output_path, /opt/ml/output/tensorboard if unset; none without it).")
    # metrics trackers (container/trackers/, docs/metrics.md): the records of metrics.jsonl, from rank 0
    wandb_project: str | None = Field(
        None, description="smlaunch: send the metric records to this Weights & Biases project (turns W&B on; "
                          "the image needs smlaunch[wandb]; credentials: WANDB_API_KEY, WANDB_MODE=offline for "
                          "local files; docs/metrics.md).")
    wandb_entity: str | None = Field(None, description="smlaunch: the W&B team or user the project belongs to.")
    wandb_run_name: str | None = Field(None, description="smlaunch: the W&B run's name (default: the job's name).")
    wandb_tags: str | None = Field(None, description='smlaunch: the W&B run\'s tags, comma-separated ("sft,8b").')
    mlflow_tracking_uri: str | None = Field(
        None, description="smlaunch: send the metric records to this MLflow tracking server or store (turns MLflow "
                          "on; http(s)://..., file:///..., a SageMaker MLflow tracking server's ARN; the image "
                          "needs smlaunch[mlflow]; credentials: MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME "
                          "and MLFLOW_TRACKING_PASSWORD; docs/metrics.md).")
    mlflow_experiment_name: str | None = Field(
        None, description="smlaunch: the MLflow experiment the run goes in, created if missing (default: "
                          "MLflow's Default).")
    metrics_required: bool | None = Field(
        None, description="smlaunch: the trackers this job names (wandb_project, mlflow_tracking_uri) must work: one "
                          "that cannot start fails the job before training, one that fails mid-run fails the job "
                          "(default: a warning, and training goes on without it).")
    checkpoint_freq: int | None = Field(None, ge=1, description="Checkpoint every N steps.")
    num_kept_checkpoints: int | None = Field(None, ge=1, description="Checkpoints kept.")
    checkpoint_async_mode: Literal[ASYNC_MODES] | None = Field(
        None, description="How checkpoints are written (torchtitan's checkpoint.async_mode): disabled (default: "
                          "every rank waits for the save), async (the state is copied to host memory and written "
                          "in the background while training goes on; one save in flight), async_with_pinned_mem "
                          "(async, staged in pinned host memory kept between saves; needs CUDA). docs/checkpoints.md")
    zipped_data: bool | None = Field(None, description="Data files are gzip-compressed.")
    collective_timeout: int | None = Field(
        None, ge=1, le=86400,
        description="Seconds any collective may wait for the other ranks before the job fails "
                    f"(default {COLLECTIVE_TIMEOUT_DEFAULT_S}).")
    init_timeout: int | None = Field(
        None, ge=0, le=86400,
        description="smlaunch: seconds a rank may take from the start of training (after a Hub download) to its "
                    "first completed step, and for each checkpoint save or validation pass, before its step "
                    "watchdog writes its stacks and ends it with exit code 86 (default "
                    f"{INIT_TIMEOUT_DEFAULT_S}; 0: not watched; docs/faults.md).")
    step_timeout: int | None = Field(
        None, ge=0, le=86400,
        description="smlaunch: seconds a training step may take before the rank's step watchdog writes its stacks "
                    f"and ends it with exit code 86 (default: max({STEP_TIMEOUT_FLOOR_S}, "
                    f"{STEP_TIMEOUT_MEDIANS} x the median step so far); 0: not watched; keep it below "
                    "collective_timeout; docs/faults.md).")
    profile_steps: str | None = Field(
        None, description="smlaunch: record these training steps with torch.profiler, as FIRST-LAST (both profiled, "
                          "counted from 1: 5-7) or one step; every rank writes a trace (Perfetto, "
                          "chrome://tracing) and a table of its ops by time into output_data_dir/profile/. Default "
                          "off. docs/speed.md")
    memory_snapshot_steps: str | None = Field(
        None, description="smlaunch: record the CUDA caching allocator's history (every allocation and free, with "
                          "its Python stack) over these training steps, FIRST-LAST or one step as profile_steps; "
                          "every rank writes a snapshot into output_data_dir/memory/ at the window's end, and at a "
                          "CUDA out-of-memory error inside it, for pytorch.org/memory_viz. CUDA only: without a "
                          "CUDA GPU it records nothing. Default off. docs/speed.md")
    nonfinite_policy: Literal[NONFINITE_POLICIES] | None = Field(
        None, description="smlaunch: what a step whose loss or gradient norm is not finite does: fail (default: the "
                          "job fails at that step), skip (the step applies no update and its batch is spent), "
                          "rollback (the job restarts from its newest checkpoint and skips that step's batches; "
                          "needs checkpoint_freq and max_restarts). docs/faults.md")
    nonfinite_max: int | None = Field(
        None, ge=1, description="smlaunch: how many non-finite steps nonfinite_policy skip or rollback tolerates in "
                                f"the whole run before the job fails (default {DEFAULT_NONFINITE_MAX}).")

    def known(self) -> dict:
        return {k: v for k, v in self.model_dump(exclude_none=True).items() if k in type(self).model_fields}

    @property
    def extra_keys(self) -> list[str]:
        return sorted(self.model_extra or {})


class FP8Config(Strict):
    """FP8 training settings, read from the hyperparameters (the wire format the script sees)."""

    enabled: bool = Field(False, description="FP8 on.")
    recipe: Literal[FP8_RECIPES] = Field("delayed", description="Scaling recipe.")
    amax_history_len: int = Field(1024, ge=1, description="Delayed scaling amax history length.")
    amax_compute_algo: Literal["max", "most_recent"] = Field("max", description="Amax from history.")
    margin: int = Field(0, ge=0, description="Scaling margin.")
    backend: Literal["transformer_engine", "torchao"] = Field(
        "transformer_engine", description="FP8 library."
    )
    emulate: bool = Field(False, description="Emulated FP8 where the hardware has none (tests).")

    @classmethod
    def from_hyperparameters(cls, hp: TrainingHyperparameters) -> FP8Config:
        mapping = {
            "enabled": hp.fp8,
            "recipe": hp.fp8_recipe,
            "amax_history_len": hp.fp8_amax_history_len,
            "amax_compute_algo": hp.fp8_amax_compute_algo,
            "margin": hp.fp8_margin,
            "backend": hp.fp8_backend,
            "emulate": hp.fp8_emulate,
        }
        if hp.fp8_backend == "torchao" and hp.fp8_recipe is None:
            mapping["recipe"] = "current"  # torchao's float8 training scales dynamically (tensorwise)
        if hp.fp8_backend is None and hp.fp8_recipe is not None:
            mapping["backend"] = default_fp8_backend(hp.fp8_recipe)  # tensorwise and rowwise are torchao's
        return cls(**{k: v for k, v in mapping.items() if v is not None})
