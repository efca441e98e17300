"""The client's rules for the speed choices (launcher/wire/training/speed_rules.py): an FP8 recipe its library
runs, rowwise FP8 on a GPU with its GEMM, an optimizer implementation the optimizer has, and
activation checkpointing settings that apply, and steps to profile that the run has; each names
the field, the value and the fix."""

from __future__ import annotations

import pytest

from launcher.config import validate_job
from tests.support.config_checks import issues_of, only_issue, paths
from tests.unit.test_config_rules import make_job

P5 = {"instance_type": "ml.p5.48xlarge"}
L40S = {"instance_type": "ml.g6e.48xlarge", "params": {"hybrid_shard_degree": 8}}


def test_rowwise_runs_with_torchao_on_hopper(runtime_dir):
    job = validate_job(make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "rowwise"}, **P5))
    assert (job.fp8.backend, job.fp8.recipe) == ("torchao", "rowwise")
    assert paths(make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "tensorwise"}, **P5)) == []


def test_rowwise_is_refused_on_ada_and_tensorwise_is_not(runtime_dir):
    issue = only_issue(make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "rowwise"}, **L40S),
                       "hyperparameters.fp8_recipe")[0]
    assert "compute capability >= 9.0" in issue.problem and "NVIDIA L40S" in issue.problem
    assert "fp8_recipe=tensorwise" in issue.fix
    assert paths(make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "tensorwise"}, **L40S)) == []  # control
    emulated = make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "rowwise", "fp8_emulate": 1}, **L40S)
    assert paths(emulated) == []


def test_a_recipe_and_a_library_that_cannot_run_it_are_named_together(runtime_dir):
    issue = only_issue(make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "rowwise",
                                                 "fp8_backend": "transformer_engine"}, **P5),
                       "hyperparameters.fp8_recipe")[0]
    assert "fp8_recipe=rowwise" in issue.problem and "fp8_backend=transformer_engine" in issue.problem
    assert "fp8_backend=torchao" in issue.fix
    issue = only_issue(make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "delayed", "fp8_backend": "torchao"}, **P5),
                       "hyperparameters.fp8_recipe")[0]
    assert "tensorwise or rowwise" in issue.fix
    assert paths(make_job(runtime_dir, hp={"fp8": 1, "fp8_recipe": "current", "fp8_backend": "torchao"}, **P5)) == []


def test_anyprecision_has_only_its_loop(runtime_dir):
    issue = only_issue(make_job(runtime_dir, hp={"optimizer": "anyprecision", "optimizer_implementation": "fused"}),
                       "hyperparameters.optimizer_implementation")[0]
    assert "anyprecision has no fused implementation" in issue.problem and "optimizer=adamw" in issue.fix
    for implementation in ("fused", "foreach", "for-loop"):
        assert paths(make_job(runtime_dir, hp={"optimizer_implementation": implementation})) == []
    assert paths(make_job(runtime_dir, hp={"optimizer": "anyprecision", "optimizer_implementation": "for-loop"})) == []


def test_activation_checkpointing_options_apply_only_where_they_can(runtime_dir):
    ac = {"activation_checkpointing": 1}
    assert paths(make_job(runtime_dir, hp={**ac, "activation_checkpointing_mode": "selective_op",
                                           "activation_checkpointing_freq": 2})) == []
    assert only_issue(make_job(runtime_dir, hp={"activation_checkpointing_freq": 2}),
                      "hyperparameters.activation_checkpointing_freq")
    assert only_issue(make_job(runtime_dir, hp={**ac, "activation_checkpointing_freq": 2, "offload_activations": 1}),
                      "hyperparameters.activation_checkpointing_freq")
    te = make_job(runtime_dir, hp={**ac, "fp8": 1, "activation_checkpointing_mode": "selective_op"}, **P5)
    issue = only_issue(te, "hyperparameters.activation_checkpointing_mode")[0]
    assert "activation_checkpointing_mode: full" in issue.fix


def test_a_users_script_keeps_its_own_meaning_of_these_keys(user_script_dir):
    data = make_job(user_script_dir, hp={"optimizer": "anyprecision", "optimizer_implementation": "fused",
                                         "activation_checkpointing_freq": 2},
                    image_uri=None, framework_version="2.4.1", py_version="py311")
    assert not [i for i in issues_of(data) if "optimizer_implementation" in i.path or "freq" in i.path]


@pytest.mark.parametrize("value", ["5-", "a-b", "0-3", "7-5", "5,6", ""])
def test_profile_steps_that_are_not_a_window_are_refused(runtime_dir, value):
    issue = only_issue(make_job(runtime_dir, hp={"max_steps": 20, "profile_steps": value}),
                       "hyperparameters.profile_steps")[0]
    assert issue.value == value and "FIRST-LAST" in issue.problem and "profile_steps: 5-7" in issue.fix


def test_profile_steps_are_steps_the_run_has(runtime_dir):
    for value in ("5-7", "5", 5, " 5 - 20 "):  # the controls (a number is one step, as YAML writes it)
        assert paths(make_job(runtime_dir, hp={"max_steps": 20, "profile_steps": value})) == []
    issue = only_issue(make_job(runtime_dir, hp={"max_steps": 20, "profile_steps": "18-25"}),
                       "hyperparameters.profile_steps")[0]
    assert "max_steps = 20" in issue.problem and "profile_steps: 18-20" in issue.fix
    # without max_steps, the run's default length (100) bounds it
    assert only_issue(make_job(runtime_dir, hp={"profile_steps": "99-101"}), "hyperparameters.profile_steps")


def test_a_profile_of_the_warm_up_is_a_warning(runtime_dir):
    warned = only_issue(make_job(runtime_dir, hp={"max_steps": 20, "profile_steps": "1-3"}),
                        "hyperparameters.profile_steps", level="warning")[0]
    assert "step 3 or later" in warned.fix
    assert not [i for i in issues_of(make_job(runtime_dir, hp={"max_steps": 20, "profile_steps": "3-4"}), "warning")
                if i.path == "hyperparameters.profile_steps"]  # the control


def test_the_container_refuses_a_profile_window_validation_refuses():
    from container.args import parse_args
    from container.trainer import refuse_unimplemented

    argv = ["--model_preset", "llama3-tiny", "--max_steps", "6"]
    refuse_unimplemented(parse_args(argv + ["--profile_steps", "3-6"])[0])  # the control
    with pytest.raises(ValueError, match="profile_steps = \"3-9\": reaches past the run's last step"):
        refuse_unimplemented(parse_args(argv + ["--profile_steps", "3-9"])[0])


def test_a_users_script_reads_profile_steps_as_it_likes(user_script_dir):
    data = make_job(user_script_dir, hp={"profile_steps": "every 10"}, image_uri=None, framework_version="2.4.1",
                    py_version="py311")
    assert not [i for i in issues_of(data) + issues_of(data, "warning") if "profile_steps" in i.path]
