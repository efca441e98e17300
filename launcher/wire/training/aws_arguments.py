"""Every argument of AWS's SMP v2 training script, and what smlaunch's train.py does with it.

AWS's script is `shared-scripts/arguments.py` of aws/amazon-sagemaker-examples' model_parallel_v2
examples (every version of it: `gradient_accumulation_steps` and `fp8_*` came and went); its
`train_lib.py` and `train_utils.py` say what each argument does. A job written for it runs under
smlaunch's train.py only where smlaunch does what the argument asks:

- implemented: train.py does it (`where` says which code);
- equivalent: train.py's result is the one AWS's script gets, whatever the value, because the
  argument picks one of AWS's implementations of the same computation (SMP's flash attention,
  FSDP1's flat parameters, ...) or AWS's script never reads it for the models smlaunch builds;
- values: train.py does what some values ask (`accepts`), and refuses the others by name;
- refused: train.py does not do it; every value is an error naming the argument, with the fix.

Refusals are errors for smlaunch's runtime only (`runtime_issues`, which validation and the
container both run). A script of the user's own receives every argument as written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from launcher.wire.training.data_order import DATASET_TYPES
from launcher.wire.training.issues import Issue

HP = "hyperparameters"
Status = Literal["implemented", "equivalent", "values", "refused"]


def _off(value: Any) -> bool:
    """0, false, "0", "False", "" as the toolkit passes them: the argument's feature is off."""
    return str(value).strip().lower() in ("0", "false", "0.0", "", "none")


def _is(*allowed: str) -> Callable[[Any], bool]:
    return lambda value: str(value).strip() in allowed


@dataclass(frozen=True)
class Argument:
    name: str
    status: Status
    where: str  # implemented: the code that does it; otherwise why it is accepted or refused
    fix: str = ""  # for the values it refuses
    accepts: Callable[[Any], bool] | None = None  # values: which it accepts

    def allows(self, value: Any) -> bool:
        if self.status == "refused":
            return False
        return self.accepts is None or value is None or self.accepts(value)


def _implemented(name: str, where: str) -> Argument:
    return Argument(name, "implemented", where)


def _equivalent(name: str, why: str) -> Argument:
    return Argument(name, "equivalent", why)


SEED_END = 2**63  # seeds are 0 <= seed < SEED_END


def _seed(value: Any) -> bool:
    try:
        seed = int(str(value).strip())  # the toolkit passes it as text
    except ValueError:
        return True  # not a whole number: the typed field's error
    return 0 <= seed < SEED_END


_MODEL = "launcher/wire/training/model_resolution.py (MODEL_TYPES) -> container/models"
_GPT2_DROPOUT = ("AWS's script sets it on gpt2 only; its GPT-NeoX, Llama, Mistral and Mixtral configs train "
                 "without dropout, as smlaunch's models do")

ARGUMENTS: tuple[Argument, ...] = (
    # optimization
    _implemented("train_batch_size", "launcher/wire/training/run_settings.py (micro_batch)"),
    _implemented("gradient_accumulation_steps", "launcher/wire/training/run_settings.py (grad_accum)"),
    _implemented("max_steps", "launcher/wire/training/run_settings.py; container/loop.py"),
    Argument("max_training_steps", "refused", "AWS's script's second name for max_steps",
             "rename it max_steps"),
    _equivalent("epochs", "AWS's script declares it and never reads it: both train max_steps steps, starting "
                          "another pass over the data when one ends"),
    Argument("seed", "values", "launcher/wire/training/run_settings.py: initialisation, synthetic data, shuffles, with "
                               "seeds 0 to 2^63 - 1 (torch holds a seed in a signed 64-bit integer, numpy's "
                               "generators take none below 0)",
             f"use a seed from 0 to {SEED_END - 1} (2^63 - 1)", _seed),
    _equivalent("same_seed", "AWS's script declares it and never reads it"),
    _implemented("bf16", "launcher/wire/training/run_settings.py; FSDP2's mixed precision"),
    _implemented("fp8", "container/fp8.py"),
    _implemented("fp8_amax_history_len", "container/fp8.py (Transformer Engine's delayed scaling)"),
    _implemented("fp8_amax_compute_algo", "container/fp8.py (Transformer Engine's delayed scaling)"),
    _implemented("grad_clip", "container/optim.py (clip_grad_norm_)"),
    _implemented("weight_decay", "container/optim.py"),
    _implemented("beta1", "container/optim.py"),
    _implemented("beta2", "container/optim.py"),
    # learning rate
    _implemented("lr", "container/optim.py"),
    Argument("lr_decay_style", "values", "container/optim.py: constant, linear and cosine; AWS's exponential and "
                                         "plateau schedules are not there",
             "use constant, linear or cosine", _is("constant", "linear", "cosine")),
    _implemented("lr_decay_iters", "container/optim.py"),
    _implemented("min_lr", "container/optim.py"),
    _implemented("warmup", "container/optim.py (a fraction of lr_decay_iters)"),
    Argument("plateau", "values", "smlaunch's schedule warms up, then decays: it keeps no plateau at the peak",
             "remove it, or set 0", _off),
    # memory
    _implemented("activation_checkpointing", "container/distributed/parallelize.py"),
    _equivalent("patch_neox_rope", "it moves transformers' GPT-NeoX RoPE caches to the GPU; smlaunch's RoPE "
                                   "tables live on the model's device"),
    _implemented("delayed_param", "container/distributed/parallelize.py (materialize_on_rank0_init)"),
    _equivalent("enable_memory_profiling", "smlaunch reports the peak memory of every logged step "
                                           "(peak_memory_gib) whatever it says"),
    _implemented("clean_cache", "container/loop.py (torch.cuda.empty_cache after each step)"),
    # logging
    _implemented("logging_freq", "container/loop.py"),
    Argument("logging_freq_for_avg", "refused", "smlaunch logs each logged step's loss, not a running average",
             "remove it: metrics.jsonl holds every logged step's loss, to average as you like"),
    _equivalent("log_reduced_training_loss", "smlaunch's logged loss is always the step's loss over every "
                                             "data-parallel rank"),
    _implemented("tensorboard_dir", "container/args.py; container/tensorboard.py"),
    # checkpoints
    _implemented("num_kept_checkpoints", "container/checkpoint/checkpointer.py"),
    _implemented("checkpoint_freq", "container/checkpoint/checkpointer.py"),
    _implemented("checkpoint_dir", "container/args.py"),
    Argument("resume_from_checkpoint", "refused", "smlaunch resumes from the latest checkpoint in checkpoint_dir by "
                                                  "itself (docs/spot.md)",
             "remove it; keep the checkpoint to resume as the latest in checkpoint_dir (checkpoint_s3_uri)"),
    Argument("checkpoint_type", "values", "smlaunch's checkpoints are sharded DCP checkpoints (AWS's "
                                          "sharded); local, use_pg_with_util and the async kinds are not there",
             "remove it, or set sharded", _is("sharded")),
    _implemented("model_dir", "container/args.py (the exported model)"),
    _equivalent("save_final_model", "smlaunch always exports the trained model to model_dir (model.tar.gz)"),
    # inputs
    Argument("dataset_type", "values", f"container/data: {', '.join(DATASET_TYPES)}; AWS's gpt_jsonl and hf "
                                       "readers are not there",
             f"use one of {', '.join(DATASET_TYPES)} (docs/data.md)", _is(*DATASET_TYPES)),
    _equivalent("data_num_workers", "smlaunch's loader reads in the training process; the batches are the same"),
    Argument("data_type", "values", "smlaunch trains causal language models (AWS's gpt); bert is not there",
             "remove it, or set gpt", lambda value: str(value).strip().lower() == "gpt"),
    Argument("use_synthetic_data", "values", "smlaunch names synthetic data with dataset_type",
             "use dataset_type: synthetic instead", _off),
    _equivalent("zipped_data", "smlaunch reads .gz files by their name, compressed or not whatever it says"),
    _implemented("training_dir", "container/args.py"),
    _implemented("test_dir", "container/args.py"),
    # model
    _implemented("hf_pretrained_model_name_or_dir", "container/checkpoint/pretrained.py; docs/models.md"),
    _implemented("max_context_width", "launcher/wire/training/run_settings.py; max_position_embeddings of a "
                                      "model_type model"),
    _implemented("vocab_size", _MODEL),
    _implemented("hidden_width", _MODEL),
    _implemented("num_layers", _MODEL),
    _implemented("num_heads", _MODEL),
    _equivalent("resid_pdrop", _GPT2_DROPOUT),
    _equivalent("embd_pdrop", _GPT2_DROPOUT),
    _equivalent("attn_pdrop", _GPT2_DROPOUT),
    _equivalent("summary_first_pdrop", _GPT2_DROPOUT),
    _implemented("initializer_range", "container/models (the projections' initialisation)"),
    # gpt2, which smlaunch does not build, is refused with the other models (model_resolution.trainable_issues)
    _implemented("model_type", f"{_MODEL}: gpt_neox, llama_v2, llama_v3, mistral, mixtral"),
    _implemented("rotary_pct", f"{_MODEL} (GPT-NeoX; refused for the others, which rotate whole heads)"),
    _implemented("rotary_emb_base", _MODEL),
    _implemented("rope_scaling_type", f"{_MODEL} (Llama 3.1's llama3 scaling; refused for GPT-NeoX)"),
    _implemented("rope_scaling_factor", _MODEL),
    _implemented("rope_scaling_high_freq_factor", _MODEL),
    _implemented("rope_scaling_low_freq_factor", _MODEL),
    _implemented("rope_scaling_original_max_position_embeddings", _MODEL),
    _equivalent("use_smp_flash_attn", "smlaunch's attention runs PyTorch's fused kernels (flash attention on GPUs)"),
    _implemented("llama_intermediate_size", _MODEL),
    _implemented("intermediate_size", _MODEL),
    _implemented("sliding_window", f"{_MODEL}; container/models/attention.py (Mistral, Mixtral; refused for "
                                   "the others)"),
    _implemented("num_key_value_heads", f"{_MODEL} (grouped-query attention; GPT-NeoX has none)"),
    _implemented("num_experts_per_tok", "container/models/moe.py (top-k routing); exported as num_experts_per_tok"),
    _implemented("num_local_experts", "container/models/moe.py"),
    Argument("moe_load_balancing", "values", "container/models/moe.py: aux_loss (Mixtral's load-balancing loss, "
                                             "router_aux_loss_coef) and none (no such loss); SMP's sinkhorn and "
                                             "balanced routers are not there",
             "use aux_loss (with router_aux_loss_coef) or none", _is("aux_loss", "none")),
    Argument("global_token_shuffle", "values", "SMP's MoE shuffles tokens across ranks before routing; smlaunch "
                                               "routes each token where it is",
             "remove it, or set 0", _off),
    _equivalent("moe_all_to_all_dispatcher", "under expert parallelism smlaunch's experts receive their tokens by "
                                             "all-to-all; the result does not depend on the dispatcher"),
    _equivalent("use_smp_implementation", "smlaunch's models are its own, and equal transformers' "
                                          "(tests/unit/test_model_types.py)"),
    _implemented("cp_comm_type", "container/distributed/context_parallel.py (Transformer Engine)"),
    _equivalent("moe", "it picks SMP's MoE layer; smlaunch's is its own, routed as moe_load_balancing says"),
    _equivalent("moe_fp8_checkpoint_attn", "activation checkpointing does not change what is computed; smlaunch "
                                           "checkpoints whole blocks"),
    _equivalent("moe_fp8_checkpoint_moe", "activation checkpointing does not change what is computed; smlaunch "
                                          "checkpoints whole blocks"),
    # FSDP
    _equivalent("limit_all_gathers", "FSDP2 holds at most the next unit's all-gather in flight by design"),
    _equivalent("forward_prefetch", "FSDP2 overlaps the next unit's all-gather with the forward by design"),
    _implemented("sharding_strategy", "launcher/wire/training/layout.py; container/distributed/parallelize.py"),
    _equivalent("use_orig_params", "FSDP2 shards the original parameters, never flattened ones"),
    Argument("backward_fetch_policy", "values", "FSDP2 gathers the previous unit before its backward "
                                                "(backward_pre); backward_post is not there",
             "remove it, or set backward_pre", _is("backward_pre")),
    _implemented("auto_wrap_policy", "container/distributed/parallelize.py (fsdp_units)"),
    # validation
    _implemented("validation_freq", "container/loop.py"),
    _implemented("validation_batches", "container/trainer.py"),
    _equivalent("preserve_np_state", "smlaunch's data order is a function of the sample's index: no NumPy "
                                     "random state to keep"),
    Argument("fast_validation", "values", "smlaunch validates on the first validation_batches batches of the "
                                          "validation channel, not on its last file",
             "remove it (or 0), and bound validation with validation_batches", _off),
    _implemented("val_batch_size", "container/trainer.py"),
    # others
    Argument("distributed_backend", "values", "the runtime runs NCCL on GPUs and gloo on CPUs; SageMaker's SMDDP "
                                              "collectives are not there",
             "remove it, or set nccl", _is("nccl", "gloo")),
    Argument("nccl_test_log", "values", "AWS's script runs an NCCL test and logs it there; smlaunch does not",
             "remove it", lambda value: str(value).strip() == ""),
    Argument("profile_nsys", "values", "smlaunch's train.py marks no Nsight Systems ranges",
             "remove it, or set 0 (run nsys around the job yourself)", _off),
    Argument("framework", "values", "smlaunch's train.py is an FSDP script (AWS's fsdp)",
             "remove it, or set fsdp", _is("fsdp")),
)
BY_NAME = {argument.name: argument for argument in ARGUMENTS}


def runtime_issues(hp) -> list[Issue]:
    """The AWS arguments of `hp` (TrainingHyperparameters) that smlaunch's train.py does not do,
    one error each, naming the argument, what it asks and the fix."""
    raw = hp.raw()
    issues = []
    for name, value in raw.items():
        argument = BY_NAME.get(name)
        if argument is None or argument.allows(value):
            continue
        at = "" if argument.status == "refused" else " at this value"
        issues.append(Issue(f"{HP}.{name}", value,
                            f"an argument of AWS's SMP v2 script that smlaunch's train.py does not implement{at} "
                            f"({argument.where})", argument.fix))
    return issues


def table() -> list[tuple[str, str, str]]:
    """(argument, status, where or why) for every argument of AWS's script, for the docs."""
    return [(a.name, a.status, a.where) for a in ARGUMENTS]
