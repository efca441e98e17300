"""SDK v2 estimator arguments that smlaunch refuses, or checks beyond what the SDK checks: each
error names the field, the value and the fix. And git_config, cloned from a real repository.
Here the tests that run in one process; those that start processes are tests/integration/test_sdk_settings.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher import PyTorch
from launcher.config import validate_job
from launcher.wire.training.issues import ConfigError
from tests.support.sdk_settings import ROLE, issues_of, job


@pytest.mark.parametrize("name", ["compiler_config", "training_recipe", "recipe_overrides"])
def test_refused_arguments_say_why(tmp_path, name):
    with pytest.raises(ConfigError) as err:
        PyTorch(**job(tmp_path), **{name: {"x": 1}})
    (issue,) = err.value.issues
    assert issue.path == name and issue.fix


def test_constructor_wait_is_said_to_be_ignored(tmp_path, capsys):
    PyTorch(**job(tmp_path), wait=False)
    assert "wait: is a fit() argument" in capsys.readouterr().err


def test_half_a_vpc_is_refused(tmp_path):
    found = issues_of(job(tmp_path, subnets=["subnet-1"]))
    assert "security_group_ids" in found and "set security_group_ids as well" in found["security_group_ids"]


def test_registry_credentials_need_vpc_access(tmp_path):
    found = issues_of(job(tmp_path, training_repository_credentials_provider_arn="arn:aws:lambda:x"))
    assert "training_repository_access_mode: Vpc" in found["training_repository_credentials_provider_arn"]


def test_network_isolation_refuses_a_hub_model_and_requirements(tmp_path):
    root = Path(__file__).resolve().parents[2]
    args = {"entry_point": "train.py", "source_dir": str(root / "entrypoints"), "role": ROLE,
            "instance_type": "ml.p4d.24xlarge", "enable_network_isolation": True,
            "hyperparameters": {"hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B", "max_steps": 1},
            "distribution": {"torch_distributed": {"enabled": True}}}
    found = issues_of(args)
    assert "no network to download it" in found["hyperparameters.hf_pretrained_model_name_or_dir"]
    user = job(tmp_path, enable_network_isolation=True)
    (Path(user["source_dir"]) / "requirements.txt").write_text("numpy\n")
    warned = {w.path: w.problem for w in validate_job(user).warnings}
    assert "fails without network" in warned["enable_network_isolation"]


def test_instance_groups_follow_the_sdk(tmp_path):
    groups = [{"instance_group_name": "a", "instance_type": "ml.p4d.24xlarge", "instance_count": 1},
              {"instance_group_name": "b", "instance_type": "ml.c5.xlarge", "instance_count": 1}]
    base = job(tmp_path, instance_groups=groups)
    base.pop("instance_type")
    both = dict(base, instance_type="ml.g5.xlarge")
    with pytest.raises(ConfigError, match="instance_groups replaces instance_type"):
        validate_job(both)
    found = issues_of(dict(base, distribution={"torch_distributed": {"enabled": True}}))
    assert "set distribution.instance_groups: ['a']" in found["distribution.instance_groups"]
    found = issues_of(dict(base, distribution={"torch_distributed": {"enabled": True}, "instance_groups": ["a"]}))
    assert "mpi or smdistributed.dataparallel" in found["distribution.instance_groups"]
    ok = validate_job(dict(base, distribution={"mpi": {"enabled": True}, "instance_groups": ["a"]}))
    assert (ok.config.instance_type, ok.config.instance_count) == ("ml.p4d.24xlarge", 1)  # the group that trains


def test_debugger_settings_that_contradict(tmp_path):
    found = issues_of(job(tmp_path, disable_profiler=True, profiler_config={"disable_profiler": False}))
    assert "contradicts disable_profiler" in found["profiler_config.disable_profiler"]
    found = issues_of(job(tmp_path, region="eu-central-2", debugger_hook_config={"s3_output_path": "s3://b/d"}))
    assert "has no SageMaker Debugger" in found["debugger_hook_config"]




def test_local_mode_says_what_it_leaves_out(tmp_path):
    validated = validate_job(job(tmp_path, instance_type="local", framework_version=None, py_version=None,
                                 max_retry_attempts=2, subnets=["s"], security_group_ids=["g"]))
    said = {w.path for w in validated.warnings}
    assert {"max_retry_attempts", "subnets", "security_group_ids"} <= said


