"""The client's rules for the speed choices (launcher/config/speed_rules.py): an FP8 recipe its library
runs, rowwise FP8 on a GPU with its GEMM, an optimizer implementation the optimizer has, and
activation checkpointing settings that apply; each names the field, the value and the fix."""

from __future__ import annotations

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
