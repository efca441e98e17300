"""AWS's SMP v2 script's arguments under smlaunch's train.py: every argument of every version of
its arguments.py is in the table; what train.py does not do is an error naming the argument and
the fix (in validation and in the container alike), what it does is accepted, and a script of
the user's own receives every one of them as written."""

from __future__ import annotations

import pytest

from container.args import parse_args
from container.trainer import refuse_unimplemented
from launcher.config import ConfigError, TrainingHyperparameters, validate_job
from launcher.config.sent_hyperparameters import user_hyperparameters
from launcher.wire.training.aws_arguments import ARGUMENTS, BY_NAME, runtime_issues
from tests.support.train_runs import ROOT

# The union of aws/amazon-sagemaker-examples' model_parallel_v2 shared-scripts/arguments.py over
# its history (2023-2024): what the table must cover.
AWS_ARGUMENTS = """
activation_checkpointing attn_pdrop auto_wrap_policy backward_fetch_policy beta1 beta2 bf16 checkpoint_dir
checkpoint_freq checkpoint_type clean_cache cp_comm_type data_num_workers data_type dataset_type delayed_param
distributed_backend embd_pdrop enable_memory_profiling epochs fast_validation forward_prefetch fp8
fp8_amax_compute_algo fp8_amax_history_len framework global_token_shuffle grad_clip gradient_accumulation_steps
hf_pretrained_model_name_or_dir hidden_width initializer_range intermediate_size limit_all_gathers
llama_intermediate_size log_reduced_training_loss logging_freq logging_freq_for_avg lr lr_decay_iters
lr_decay_style max_context_width max_steps max_training_steps min_lr model_dir model_type moe
moe_all_to_all_dispatcher moe_fp8_checkpoint_attn moe_fp8_checkpoint_moe moe_load_balancing nccl_test_log
num_experts_per_tok num_heads num_kept_checkpoints num_key_value_heads num_layers num_local_experts
patch_neox_rope plateau preserve_np_state profile_nsys resid_pdrop resume_from_checkpoint rope_scaling_factor
rope_scaling_high_freq_factor rope_scaling_low_freq_factor rope_scaling_original_max_position_embeddings
rope_scaling_type rotary_emb_base rotary_pct same_seed save_final_model seed sharding_strategy sliding_window
summary_first_pdrop tensorboard_dir test_dir train_batch_size training_dir use_orig_params use_smp_flash_attn
use_smp_implementation use_synthetic_data val_batch_size validation_batches validation_freq vocab_size warmup
weight_decay zipped_data
""".split()
REFUSED = {  # argument: a value train.py does not do
    "max_training_steps": 10, "logging_freq_for_avg": 50, "resume_from_checkpoint": "step-10", "plateau": 0.1,
    "checkpoint_type": "local", "data_type": "bert", "use_synthetic_data": 1, "moe_load_balancing": "sinkhorn",
    "global_token_shuffle": 1, "backward_fetch_policy": "backward_post", "fast_validation": 1,
    "distributed_backend": "smddp", "nccl_test_log": "nccl.log", "profile_nsys": 1, "framework": "megatron",
    "seed": 2**63,  # torch: "Overflow when unpacking long long"
}
ACCEPTED = {  # as the seed and AWS's notebooks pass them
    "epochs": 100, "same_seed": 0, "plateau": 0.0, "patch_neox_rope": 0, "enable_memory_profiling": 1,
    "clean_cache": 0, "log_reduced_training_loss": 1, "checkpoint_type": "sharded", "save_final_model": 1,
    "data_num_workers": 2, "data_type": "gpt", "use_synthetic_data": 0, "zipped_data": 0, "resid_pdrop": 0.1,
    "embd_pdrop": 0.1, "attn_pdrop": 0.1, "summary_first_pdrop": 0.1, "use_smp_flash_attn": 1,
    "use_smp_implementation": 1, "moe_all_to_all_dispatcher": 1, "moe_fp8_checkpoint_attn": 1,
    "moe_fp8_checkpoint_moe": 1, "global_token_shuffle": 0, "limit_all_gathers": 1, "forward_prefetch": 1,
    "use_orig_params": 0, "backward_fetch_policy": "backward_pre", "preserve_np_state": 1, "fast_validation": 0,
    "distributed_backend": "gloo", "nccl_test_log": "", "profile_nsys": 0, "framework": "fsdp",
    "seed": 2**63 - 1,
}


def job(hp: dict, source_dir) -> dict:
    return {"entry_point": "train.py", "source_dir": str(source_dir), "instance_type": "local",
            "processes_per_host": 1, "hyperparameters": {"model_preset": "llama3-tiny", "max_context_width": 64, **hp}}


def test_the_table_is_aws_arguments_each_once():
    names = [a.name for a in ARGUMENTS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(AWS_ARGUMENTS)
    for argument in ARGUMENTS:
        assert argument.where, argument.name
        if argument.status in ("values", "refused"):
            assert argument.fix, argument.name
    assert {a.status for a in ARGUMENTS} == {"implemented", "equivalent", "values", "refused"}


def test_what_train_py_does_not_do_is_refused_by_name():
    for name, value in REFUSED.items():
        (issue,) = runtime_issues(TrainingHyperparameters.model_validate({name: value}))
        assert issue.path == f"hyperparameters.{name}" and issue.fix == BY_NAME[name].fix
        assert "AWS's SMP v2 script that smlaunch's train.py does not implement" in issue.problem
    assert runtime_issues(TrainingHyperparameters.model_validate(ACCEPTED)) == []


def test_validation_refuses_them_for_train_py_and_passes_them_to_a_script_of_ones_own(user_script_dir):
    with pytest.raises(ConfigError) as caught:
        validate_job(job(REFUSED, ROOT / "entrypoints"))
    refused = {i.path.removeprefix("hyperparameters.") for i in caught.value.issues if i.level == "error"}
    assert refused == set(REFUSED)
    script = validate_job(job(REFUSED, user_script_dir))
    assert user_hyperparameters(script.config) == dict(sorted(
        {"model_preset": "llama3-tiny", "max_context_width": 64, **REFUSED}.items()))
    # what train.py does is no finding at all: no "passed to the script as is" warning either
    accepted = validate_job(job(ACCEPTED, ROOT / "entrypoints"))
    assert [w for w in accepted.warnings if any(name in w.path for name in ACCEPTED)] == []


def test_the_container_refuses_them_as_the_toolkit_passes_them():
    hp, _, _ = parse_args(["--model_preset", "llama3-tiny", "--profile_nsys", "1", "--plateau", "0.25"])
    with pytest.raises(ValueError, match=r"hyperparameters.profile_nsys = \"1\": .*at this value.*; remove it, "
                                         r"or set 0 .*hyperparameters.plateau = \"0.25\""):
        refuse_unimplemented(hp)
    hp, _, _ = parse_args(["--model_preset", "llama3-tiny", "--profile_nsys", "0", "--plateau", "0.0",
                           "--fast_validation", "False", "--checkpoint_type", "sharded"])
    refuse_unimplemented(hp)


def test_a_seed_outside_0_to_2_63_is_refused_as_the_toolkit_passes_it():
    for seed in ("0", "9223372036854775807"):  # the control: the ends of the range
        refuse_unimplemented(parse_args(["--model_preset", "llama3-tiny", "--seed", seed])[0])
    for seed in ("9223372036854775808", "-1"):
        hp, _, _ = parse_args(["--model_preset", "llama3-tiny", "--seed", seed])
        with pytest.raises(ValueError, match=rf'hyperparameters.seed = "{seed}": .*; use a seed from 0 to '
                                             r"9223372036854775807 \(2\^63 - 1\)"):
            refuse_unimplemented(hp)


def test_the_docs_table_is_the_code_table():
    """docs/models.md lists every argument with the status the code gives it."""
    text = (ROOT / "docs" / "models.md").read_text()
    for argument in ARGUMENTS:
        assert f"| `{argument.name}` | {argument.status} | {argument.where}." in text, argument.name
