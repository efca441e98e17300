"""Every validation rule: a valid case passes, an invalid case names the field, the value and a fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from launcher.config import ParallelLayout, validate_job
from tests.support.config_checks import MP, issues_of, only_issue, paths

# A user's script names its image, as the SageMaker SDK requires: the seed's SMP v2 image.
SCRIPT_IMAGE = {"framework_version": "2.4.1", "py_version": "py311"}


def make_job(runtime_dir, *, params=None, hp=None, **fields):
    job = {
        "entry_point": "train.py",
        "source_dir": str(runtime_dir),
        "instance_type": "ml.p4d.24xlarge",
        "hyperparameters": {"bf16": 1, "max_context_width": 16384,
                            "hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B"},
        "distribution": {
            "torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"hybrid_shard_degree": 8}}},
        },
    }
    job["hyperparameters"].update(hp or {})
    job["distribution"]["smdistributed"]["modelparallel"]["parameters"].update(params or {})
    job.update(fields)
    return job








def test_seed_shape_is_valid(runtime_dir):
    job = validate_job(make_job(runtime_dir, params={"context_parallel_degree": 8}))
    assert job.layout == ParallelLayout(world=8, dp_replicate=1, dp_shard=1, cp=8, tp=1)
    assert job.model.name == "llama3.1-8b"


@pytest.mark.parametrize("key", ["tensor_parallel_degree", "context_parallel_degree", "expert_parallel_degree"])
def test_degrees_must_be_positive_integers(runtime_dir, key):
    assert paths(make_job(runtime_dir, params={key: 0})) == [f"{MP}.{key}"]
    assert f"{MP}.{key}" in paths(make_job(runtime_dir, params={key: 2.5}))
    assert f"{MP}.{key}" in paths(make_job(runtime_dir, params={key: "two"}))


def test_hybrid_shard_degree_zero_allowed_negative_not(runtime_dir):
    assert paths(make_job(runtime_dir, params={"hybrid_shard_degree": 0})) == []
    assert paths(make_job(runtime_dir, params={"hybrid_shard_degree": -1})) == [f"{MP}.hybrid_shard_degree"]


def test_tp_must_divide_world(runtime_dir):
    assert paths(make_job(runtime_dir, params={"tensor_parallel_degree": 2, "hybrid_shard_degree": 4})) == []
    issue = only_issue(make_job(runtime_dir, params={"tensor_parallel_degree": 16, "hybrid_shard_degree": 0}),
                       f"{MP}.tensor_parallel_degree")[0]
    assert issue.value == 16 and "8" in issue.problem


def test_cp_must_divide_world(runtime_dir):
    issue = only_issue(make_job(runtime_dir, params={"context_parallel_degree": 3}), f"{MP}.context_parallel_degree")
    assert any("world size 8" in i.problem for i in issue)


def test_ep_must_divide_world_even_for_moe(runtime_dir):
    data = make_job(runtime_dir, params={"expert_parallel_degree": 3}, hp={"moe": 1})
    assert any("world size" in i.problem for i in only_issue(data, f"{MP}.expert_parallel_degree"))


def test_hybrid_shard_degree_range_and_divisibility(runtime_dir):
    assert paths(make_job(runtime_dir, params={"hybrid_shard_degree": 4})) == []
    over = only_issue(make_job(runtime_dir, params={"hybrid_shard_degree": 16}), f"{MP}.hybrid_shard_degree")
    assert "exceeds" in over[0].problem
    # 3 instances x 8 = 24 ranks, tp 2 -> 12; hsd 8 does not divide 12.
    data = make_job(runtime_dir, instance_count=3, params={"hybrid_shard_degree": 8, "tensor_parallel_degree": 2})
    assert any("not divisible" in i.problem for i in only_issue(data, f"{MP}.hybrid_shard_degree"))


def test_cp_must_fit_in_sharding_group(runtime_dir):
    assert paths(make_job(runtime_dir, params={"hybrid_shard_degree": 4, "context_parallel_degree": 4})) == []
    data = make_job(runtime_dir, params={"hybrid_shard_degree": 2, "context_parallel_degree": 4})
    assert any("sharding group (2 ranks)" in i.problem for i in only_issue(data, f"{MP}.context_parallel_degree"))
    # hybrid_shard_degree 0 means the whole world / tp: cp 8 fits in 8 ranks.
    assert paths(make_job(runtime_dir, params={"hybrid_shard_degree": 0, "context_parallel_degree": 8})) == []


def test_sequence_divisible_by_2_cp_tp(runtime_dir):
    assert paths(make_job(runtime_dir, params={"context_parallel_degree": 8}, hp={"max_context_width": 16384})) == []
    issue = only_issue(make_job(runtime_dir, params={"context_parallel_degree": 8}, hp={"max_context_width": 16004}),
                       "hyperparameters.max_context_width")[0]
    assert issue.value == 16004 and "16" in issue.problem and "16000" in issue.fix
    # without CP the length is free
    assert paths(make_job(runtime_dir, hp={"max_context_width": 16001})) == []


def test_tp_must_divide_heads_when_model_known(runtime_dir):
    ok = make_job(runtime_dir, params={"tensor_parallel_degree": 8, "hybrid_shard_degree": 1})
    assert paths(ok) == []
    # llama3.2-3b has 24 heads and 8 kv heads: tp 16 > world too, so use 2 hosts (16 ranks).
    data = make_job(runtime_dir, instance_count=2, params={"tensor_parallel_degree": 16, "hybrid_shard_degree": 1},
                    hp={"hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.2-3B"})
    problems = [i.problem for i in only_issue(data, f"{MP}.tensor_parallel_degree")]
    assert any("24 attention heads" in p for p in problems) and any("8 key/value heads" in p for p in problems)


def test_tp_heads_check_uses_explicit_shape(runtime_dir):
    data = make_job(runtime_dir, params={"tensor_parallel_degree": 4, "hybrid_shard_degree": 2},
                    hp={"hf_pretrained_model_name_or_dir": None, "model_preset": "llama3-tiny", "num_heads": 6})
    assert any("6 attention heads" in i.problem for i in only_issue(data, f"{MP}.tensor_parallel_degree"))


def test_tp_unknown_model_is_not_checked(user_script_dir):
    data = make_job(user_script_dir, params={"tensor_parallel_degree": 8, "hybrid_shard_degree": 1},
                    hp={"hf_pretrained_model_name_or_dir": "my-org/unknown-model"}, **SCRIPT_IMAGE)
    assert paths(data) == []


def test_expert_parallel_needs_moe(runtime_dir, user_script_dir):
    dense = make_job(runtime_dir, params={"expert_parallel_degree": 2})
    assert "dense" in only_issue(dense, f"{MP}.expert_parallel_degree")[0].problem
    # a model_type of the user's own script's choosing (mixtral) is MoE: ep is no error there
    assert paths(make_job(user_script_dir, params={"expert_parallel_degree": 2}, hp={"model_type": "mixtral"},
                          **SCRIPT_IMAGE)) == []


def test_sharded_data_parallel_degree_rules(runtime_dir):
    v1 = {"sharded_data_parallel_degree": 4, "ddp": True}
    assert paths(make_job(runtime_dir, params={"hybrid_shard_degree": 0, **v1})) == []
    job = validate_job(make_job(runtime_dir, params={"hybrid_shard_degree": 0, **v1}))
    assert job.layout.sharding_group == 4 and job.layout.dp_replicate == 2
    key = f"{MP}.sharded_data_parallel_degree"
    assert only_issue(make_job(runtime_dir, params={"hybrid_shard_degree": 0, "sharded_data_parallel_degree": 3}), key)
    assert any("pipeline" in i.problem for i in only_issue(
        make_job(runtime_dir, params={"hybrid_shard_degree": 0, "pipeline_parallel_degree": 2, **v1}), key))
    assert any("shard_optimizer_state" in i.problem for i in only_issue(
        make_job(runtime_dir, params={"hybrid_shard_degree": 0, "shard_optimizer_state": True, **v1}), key))
    assert any("hybrid_shard_degree" in i.problem for i in only_issue(
        make_job(runtime_dir, params={"hybrid_shard_degree": 2, **v1}), key))
    with_tp = make_job(runtime_dir, params={"hybrid_shard_degree": 0, "tensor_parallel_degree": 2,
                                           "sharded_data_parallel_degree": 2})
    assert only_issue(with_tp, f"{MP}.prescaled_batch")
    with_tp["distribution"]["smdistributed"]["modelparallel"]["parameters"]["prescaled_batch"] = True
    assert paths(with_tp) == []


def test_smp_v1_job_with_mpi_is_valid(runtime_dir):
    data = make_job(runtime_dir, instance_type="ml.p3.16xlarge",
                    hp={"bf16": None, "fp16": 1},
                    distribution={"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                        "ddp": True, "sharded_data_parallel_degree": 2, "fp16": True}}},
                        "mpi": {"enabled": True, "processes_per_host": 8}})
    assert paths(data) == []


def test_fp8_needs_fp8_hardware(runtime_dir):
    p4d = make_job(runtime_dir, hp={"fp8": 1})
    issue = only_issue(p4d, "hyperparameters.fp8")[0]
    assert "A100" in issue.problem and "ml.p5.48xlarge" in issue.fix
    assert paths(make_job(runtime_dir, instance_type="ml.p5.48xlarge", hp={"fp8": 1})) == []
    for inst in ("ml.g5.48xlarge", "ml.p3.16xlarge", "ml.trn1.32xlarge"):
        data = make_job(runtime_dir, instance_type=inst, hp={"fp8": 1, "bf16": 0, "fp16": 0},
                        params={"hybrid_shard_degree": 0})
        assert any("no FP8" in i.problem for i in issues_of(data) if i.path == "hyperparameters.fp8"), inst


def test_fp8_on_local_cpu_needs_emulation_flag(runtime_dir):
    data = make_job(runtime_dir, instance_type="local", processes_per_host=2, hp={"fp8": 1},
                    params={"hybrid_shard_degree": 2})
    assert only_issue(data, "hyperparameters.fp8")
    data["hyperparameters"]["fp8_emulate"] = 1
    assert paths(data) == []


def test_fp8_needs_bf16(runtime_dir):
    data = make_job(runtime_dir, instance_type="ml.p5.48xlarge", hp={"fp8": 1, "bf16": 0})
    assert any("bf16" in i.fix for i in only_issue(data, "hyperparameters.fp8"))


def test_torchao_fp8_refuses_delayed_recipe(runtime_dir):
    base = {"instance_type": "ml.p5.48xlarge"}
    assert paths(make_job(runtime_dir, hp={"fp8": 1, "fp8_backend": "torchao"}, **base)) == []
    job = validate_job(make_job(runtime_dir, hp={"fp8": 1, "fp8_backend": "torchao"}, **base))
    assert job.fp8.recipe == "current"
    assert only_issue(make_job(runtime_dir, hp={"fp8": 1, "fp8_backend": "torchao", "fp8_recipe": "delayed"}, **base),
                      "hyperparameters.fp8_recipe")


def test_bf16_needs_ampere(runtime_dir):
    data = make_job(runtime_dir, instance_type="ml.p3.16xlarge")
    assert "bfloat16" in only_issue(data, "hyperparameters.bf16")[0].problem


def test_bf16_and_fp16_conflict(runtime_dir):
    assert only_issue(make_job(runtime_dir, hp={"fp16": 1}), "hyperparameters.fp16")


def test_offloading_needs_checkpointing(runtime_dir):
    key = f"{MP}.sm_activation_offloading"
    assert paths(make_job(runtime_dir, params={"sm_activation_offloading": True},
                          hp={"activation_checkpointing": 1})) == []
    # the SMP default (True) alone is no error when checkpointing is off
    assert paths(make_job(runtime_dir, hp={"activation_checkpointing": 0})) == []
    assert only_issue(make_job(runtime_dir, params={"sm_activation_offloading": True},
                               hp={"activation_checkpointing": 0}), key)
    assert only_issue(make_job(runtime_dir, hp={"activation_checkpointing": 0, "offload_activations": True}),
                      "hyperparameters.offload_activations")


def test_activation_loading_horizon_at_least_one(runtime_dir):
    assert paths(make_job(runtime_dir, params={"activation_loading_horizon": 0})) == [
        f"{MP}.activation_loading_horizon"]
    assert paths(make_job(runtime_dir, params={"activation_loading_horizon": 4})) == []


def test_dataparallel_with_modelparallel_is_an_error(runtime_dir):
    data = make_job(runtime_dir)
    data["distribution"]["smdistributed"]["dataparallel"] = {"enabled": True}
    assert only_issue(data, "distribution.smdistributed.dataparallel.enabled")


def test_smp_v2_needs_torch_distributed(runtime_dir):
    data = make_job(runtime_dir)
    del data["distribution"]["torch_distributed"]
    issue = only_issue(data, "distribution.torch_distributed.enabled")[0]
    assert "hybrid_shard_degree" in issue.problem


def test_mpi_with_torch_distributed_is_an_error(runtime_dir):
    data = make_job(runtime_dir)
    data["distribution"]["mpi"] = {"enabled": True}
    assert only_issue(data, "distribution.mpi.enabled")


def test_torch_distributed_on_cpu_instance(runtime_dir):
    data = make_job(runtime_dir, instance_type="ml.c5.18xlarge", hp={"bf16": 0}, params={"hybrid_shard_degree": 0})
    assert "no GPU" in only_issue(data, "distribution.torch_distributed.enabled")[0].problem
    local = make_job(runtime_dir, instance_type="local", processes_per_host=2, hp={"bf16": 0},
                     params={"hybrid_shard_degree": 2})
    assert paths(local) == []


def test_nccl_on_cpu_is_an_error(runtime_dir):
    data = make_job(runtime_dir, instance_type="local", processes_per_host=2,
                    hp={"distributed_backend": "nccl"}, params={"hybrid_shard_degree": 2})
    assert "gloo" in only_issue(data, "hyperparameters.distributed_backend")[0].fix


def test_unknown_keys_get_did_you_mean(runtime_dir):
    data = make_job(runtime_dir, params={"context_paralel_degree": 8})
    issue = only_issue(data, f"{MP}.context_paralel_degree")[0]
    assert "context_parallel_degree" in issue.fix
    top = make_job(runtime_dir, instance_cont=2)
    assert "instance_count" in only_issue(top, "instance_cont")[0].fix
    dist = make_job(runtime_dir)
    dist["distribution"]["torch_distribued"] = {"enabled": True}
    assert "torch_distributed" in only_issue(dist, "distribution.torch_distribued")[0].fix


def test_all_errors_reported_together(runtime_dir):
    data = make_job(runtime_dir, instance_count=0, volume_size=0, params={"context_paralel_degree": 8,
                                                                         "tensor_parallel_degree": 3},
                    hp={"fp8": 1})
    found = set(paths(data))
    assert {"instance_count", "volume_size", f"{MP}.context_paralel_degree", f"{MP}.tensor_parallel_degree",
            "hyperparameters.fp8"} <= found


def test_unknown_instance_type_suggests(runtime_dir):
    issue = only_issue(make_job(runtime_dir, instance_type="ml.p5.48xlarg"), "instance_type")[0]
    assert "ml.p5.48xlarge" in issue.fix


def test_instance_type_known_to_botocore_only_warns(runtime_dir, monkeypatch):
    from launcher.wire.training import catalog

    monkeypatch.setattr(catalog, "get_instance_type", lambda name: None)
    data = make_job(runtime_dir, instance_type="ml.p5.48xlarge")
    assert paths(data) == []
    assert "instance_type" in paths(data, "warning")


def test_processes_per_host(runtime_dir):
    assert only_issue(make_job(runtime_dir, processes_per_host=16), "processes_per_host")
    assert "processes_per_host" in paths(make_job(runtime_dir, processes_per_host=4,
                                                  params={"hybrid_shard_degree": 4}), "warning")
    job = validate_job(make_job(runtime_dir, instance_type="local", processes_per_host=4, hp={"bf16": 0},
                                params={"hybrid_shard_degree": 2, "context_parallel_degree": 2}))
    assert job.layout.world == 4 and job.layout.mesh_shape == (1, 2, 1, 2, 1)  # (pp, dp_replicate, dp_shard, cp, tp)


@pytest.mark.parametrize("field,bad,good", [
    ("instance_count", 0, 2),
    ("volume_size", 0, 16384),
    ("volume_size", 16385, 1),
    ("max_run", 28 * 24 * 3600 + 1, 28 * 24 * 3600),
    ("keep_alive_period_in_seconds", 21601, 21600),  # KEEP_ALIVE_MAX: botocore's model (test_warm_pools)
    ("base_job_name", "has_underscore", "has-dash"),
    ("role", "SageMakerRole", "arn:aws:iam::111122223333:role/SageMakerRole"),
    ("checkpoint_s3_uri", "/local/path", "s3://bucket/ckpt/"),
])
def test_job_field_ranges(runtime_dir, field, bad, good):
    assert paths(make_job(runtime_dir, **{field: bad})) == [field]
    assert paths(make_job(runtime_dir, **{field: good})) == []


def test_spot_rules(runtime_dir):
    assert only_issue(make_job(runtime_dir, use_spot_instances=True, max_run=3600, max_wait=1800,
                               checkpoint_s3_uri="s3://b/c"), "max_wait")
    assert paths(make_job(runtime_dir, use_spot_instances=True, max_run=3600, max_wait=7200,
                          checkpoint_s3_uri="s3://b/c")) == []
    assert "checkpoint_s3_uri" in paths(make_job(runtime_dir, use_spot_instances=True), "warning")
    assert only_issue(make_job(runtime_dir, max_wait=7200), "max_wait")


def test_sagemaker_needs_s3_inputs_and_output(runtime_dir):
    assert only_issue(make_job(runtime_dir, inputs={"train": "/data/train"}), "inputs.train")
    assert only_issue(make_job(runtime_dir, output_path="/tmp/out"), "output_path")
    assert paths(make_job(runtime_dir, inputs={"train": "s3://b/train/"}, output_path="s3://b/out")) == []


def test_missing_entry_point_and_source_dir(runtime_dir):
    assert only_issue(make_job(runtime_dir, entry_point="nope.py"), "entry_point")
    assert only_issue(make_job(runtime_dir, source_dir=str(runtime_dir / "missing")), "source_dir")
    assert only_issue(make_job(runtime_dir, dependencies=["no/such/lib"]), "dependencies[0]")


def test_hyperparameter_cross_checks(runtime_dir, user_script_dir):
    assert only_issue(make_job(runtime_dir, params={"context_parallel_degree": 8},
                               hp={"context_parallel_degree": 4}), "hyperparameters.context_parallel_degree")
    assert only_issue(make_job(runtime_dir, params={"delayed_parameter_initialization": True},
                               hp={"delayed_param": 0}), "hyperparameters.delayed_param")
    assert only_issue(make_job(runtime_dir, hp={"sharding_strategy": "no_shard"}), "hyperparameters.sharding_strategy")
    assert only_issue(make_job(runtime_dir, hp={"sharding_strategy": "ful_shard"}), "hyperparameters.sharding_strategy")
    # a name train.py does not know does nothing there, and the job trains without it: an error where the
    # name is one typo from a known one, or Hugging Face's name for one (not the nearest spelling)...
    (typo,) = issues_of(make_job(runtime_dir, hp={"max_context_widht": 8192}), "error")
    assert typo.path == "hyperparameters.max_context_widht" and typo.fix == "did you mean 'max_context_width'?"
    (hf,) = issues_of(make_job(runtime_dir, hp={"learning_rate": 0.01}), "error")
    assert hf.path == "hyperparameters.learning_rate" and hf.fix.startswith("did you mean 'lr'? (learning_rate is "
                                                                            "Hugging Face's name")
    # ...and a warning where it is near no known name, or only like one (not one typo from it)
    assert paths(make_job(runtime_dir), "warning") == []  # the control
    (unknown,) = issues_of(make_job(runtime_dir, hp={"my_custom_flag": 1}), "warning")
    assert unknown.path == "hyperparameters.my_custom_flag" and "does nothing with it" in unknown.problem
    (like,) = issues_of(make_job(runtime_dir, hp={"nested": 1}), "warning")
    assert like.path == "hyperparameters.nested" and like.fix == "did you mean 'seed'?"
    # train.py's directory arguments and AWS's script's arguments are its own names
    assert paths(make_job(runtime_dir, hp={"output_data_dir": "/opt/ml/output/data", "same_seed": 0}),
                 "warning") == []
    # a script of the user's own reads its own arguments: silently
    assert paths(make_job(user_script_dir, hp={"torch_compile": 1, "my_custom_flag": 3}, **SCRIPT_IMAGE),
                 "warning") == []


def test_metric_regex_without_group_warns(runtime_dir):
    data = make_job(runtime_dir, metric_definitions=[{"Name": "base_metric", "Regex": "<><><><><><>"}])
    assert "metric_definitions[0].Regex" in paths(data, "warning")
    assert only_issue(make_job(runtime_dir, metric_definitions=[{"Name": "m", "Regex": "(unclosed"}]),
                      "metric_definitions[0].Regex")


def test_validation_does_not_mutate_input(runtime_dir):
    data = make_job(runtime_dir, params={"context_paralel_degree": 8})
    before = copy.deepcopy(data)
    issues_of(data)
    assert data == before


def test_framework_version_must_name_an_image(user_script_dir):
    issue = only_issue(make_job(user_script_dir, framework_version="2.4.9"), "framework_version")[0]
    assert issue.value == "2.4.9" and "2.4.1" in issue.problem + issue.fix
    assert paths(make_job(user_script_dir, **SCRIPT_IMAGE)) == []
    # an explicit image skips the table; so does local mode
    assert paths(make_job(user_script_dir, framework_version="2.4.9", image_uri="my/image:1")) == []
    assert "framework_version" not in paths(make_job(user_script_dir, framework_version="2.4.9", instance_type="local"))
    assert only_issue(make_job(user_script_dir, framework_version="2.4.1", py_version="py38"), "py_version")


def test_a_user_script_names_its_image_as_the_sdk_requires(user_script_dir):
    issue = only_issue(make_job(user_script_dir), "framework_version")[0]
    assert "image_uri" in issue.fix


def test_the_runtime_needs_torch_2_6(runtime_dir):
    """Its default is the newest DLC; the seed's SMP v2 image (PyTorch 2.4.1) has no fully_shard."""
    assert paths(make_job(runtime_dir)) == []
    issue = only_issue(make_job(runtime_dir, **SCRIPT_IMAGE), "framework_version")[0]
    assert "torch >= 2.6" in issue.problem and "remove framework_version" in issue.fix
    old_dlc = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.4.0-gpu-py311"
    assert only_issue(make_job(runtime_dir, image_uri=old_dlc), "image_uri")
    assert paths(make_job(runtime_dir, image_uri="my/image:1")) == []


def test_an_image_from_another_region_warns(runtime_dir):
    image = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"
    assert "eu-west-1" in only_issue(make_job(runtime_dir, image_uri=image, region="eu-west-1"), "image_uri",
                                     "warning")[0].problem
    assert paths(make_job(runtime_dir, image_uri=image, region="us-east-1"), "warning") == []


def test_network_isolation_warns_that_the_runtimes_requirements_need_pip(runtime_dir):
    assert only_issue(make_job(runtime_dir, enable_network_isolation=True), "enable_network_isolation", "warning")


def test_sdk_refuses_two_smdistributed_strategies_even_one_off(runtime_dir):
    data = make_job(runtime_dir)
    data["distribution"]["smdistributed"]["dataparallel"] = {"enabled": False}
    assert "more than one" in only_issue(data, "distribution.smdistributed")[0].problem


def test_sdk_refuses_smdistributed_on_p5_without_torchrun(user_script_dir):
    smddp = make_job(user_script_dir, instance_type="ml.p5.48xlarge", framework_version="2.2.0", py_version="py310",
                     distribution={"smdistributed": {"dataparallel": {"enabled": True}}})
    assert "p5" in only_issue(smddp, "distribution.torch_distributed.enabled")[0].problem
    smddp["instance_type"] = "ml.p4d.24xlarge"
    assert paths(smddp) == []


def test_tp_needs_divisible_sequence_and_mlp_and_pads_the_vocabulary(runtime_dir):
    data = make_job(runtime_dir, params={"tensor_parallel_degree": 2, "hybrid_shard_degree": 4},
                    hp={"hf_pretrained_model_name_or_dir": None, "model_preset": "llama3-tiny",
                        "max_context_width": 63, "intermediate_size": 175, "vocab_size": 257})
    assert only_issue(data, "hyperparameters.max_context_width")
    problems = " ".join(i.problem for i in only_issue(data, f"{MP}.tensor_parallel_degree"))
    assert "175 MLP width" in problems and "vocabulary" not in problems
    # the vocabulary is padded, not refused: the job validates, and a note says to how many rows (257 -> 3 x 128)
    padded = make_job(runtime_dir, params={"tensor_parallel_degree": 2, "hybrid_shard_degree": 4},
                      hp={"hf_pretrained_model_name_or_dir": None, "model_preset": "llama3-tiny",
                          "max_context_width": 64, "vocab_size": 257})
    assert paths(padded) == []
    note = " ".join(i.problem for i in validate_job(padded).notes if i.path == f"{MP}.tensor_parallel_degree")
    assert "257 vocabulary entries" in note and "to 384 rows" in note and "the exported model has 257" in note
    ok = make_job(runtime_dir, params={"tensor_parallel_degree": 2, "hybrid_shard_degree": 4},
                  hp={"hf_pretrained_model_name_or_dir": None, "model_preset": "llama3-tiny", "max_context_width": 64})
    assert paths(ok) == []
    assert not [i for i in validate_job(ok).notes if "vocabulary" in i.problem]  # 256 splits: nothing to say


def test_transformer_engine_fp8_refuses_tensor_parallelism(runtime_dir):
    base = {"instance_type": "ml.p5.48xlarge", "params": {"tensor_parallel_degree": 2, "hybrid_shard_degree": 4}}
    assert only_issue(make_job(runtime_dir, hp={"fp8": 1}, **base), "hyperparameters.fp8_backend")
    assert paths(make_job(runtime_dir, hp={"fp8": 1, "fp8_backend": "torchao"}, **base)) == []


def test_fp16_warns_that_train_py_would_train_in_fp32(runtime_dir):
    issue = only_issue(make_job(runtime_dir, hp={"bf16": None, "fp16": 1}), "hyperparameters.fp16", "warning")[0]
    assert "float32" in issue.problem and "bf16" in issue.fix


def test_a_secret_hyperparameter_on_a_shared_host_is_warned_of():
    """Issue 31, item 14: hyperparameters are the command line, which every user of a local
    machine or a Slurm node reads with ps; on SageMaker the instance is the job's own."""
    from launcher.config import validate_job

    job = {"entry_point": "train.py", "source_dir": str(Path(__file__).parents[2] / "entrypoints"),
           "hyperparameters": {"model_preset": "llama3-tiny", "max_context_width": 64, "hf_token": "hf_abcdefgh",
                               "db": "postgres://u:dbPass123@h/x"}}
    local = validate_job({**job, "instance_type": "local"})
    warned = sorted(w.path for w in local.warnings if "process list" in w.problem)
    assert warned == ["hyperparameters.db", "hyperparameters.hf_token"]
    assert "pass it in environment instead (environment: {HF_TOKEN: ...})" in str(
        next(w for w in local.warnings if w.path == "hyperparameters.hf_token"))
    aws = validate_job({**job, "instance_type": "ml.p5.48xlarge"})
    assert not [w for w in aws.warnings if "process list" in w.problem]
