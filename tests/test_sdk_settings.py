"""SDK v2 estimator arguments that smlaunch refuses, or checks beyond what the SDK checks: each
error names the field, the value and the fix. And git_config, cloned from a real repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher import PyTorch
from launcher.config import validate_job
from launcher.config.issues import ConfigError

ROLE = "arn:aws:iam::111122223333:role/R"


def job(tmp: Path, **changes) -> dict:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "cifar.py").write_text("print('hi')\n")
    args = {"entry_point": "cifar.py", "source_dir": str(code), "role": ROLE, "instance_type": "ml.g5.xlarge",
            "framework_version": "2.5.1", "py_version": "py311"}
    args.update(changes)
    return args


def issues_of(args: dict) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        validate_job(args)
    return {i.path: f"{i.problem}; {i.fix}" for i in err.value.issues}


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
    root = Path(__file__).resolve().parents[1]
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


def test_rule_actions_are_refused(tmp_path):
    sagemaker = pytest.importorskip("sagemaker")
    from sagemaker.debugger import Rule, rule_configs

    actions = rule_configs.ActionList(rule_configs.StopTraining())
    rule = Rule.sagemaker(rule_configs.loss_not_decreasing(), actions=actions)
    assert sagemaker
    with pytest.raises(ConfigError, match="rule actions"):
        PyTorch(**job(tmp_path), rules=[rule])


def test_local_mode_says_what_it_leaves_out(tmp_path):
    validated = validate_job(job(tmp_path, instance_type="local", framework_version=None, py_version=None,
                                 max_retry_attempts=2, subnets=["s"], security_group_ids=["g"]))
    said = {w.path for w in validated.warnings}
    assert {"max_retry_attempts", "subnets", "security_group_ids"} <= said


# --- git_config --------------------------------------------------------------------------------------
def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> tuple[Path, str]:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "cifar.py").write_text("print('first')\n")
    _git(tmp_path, "init", "-q", "-b", "main", str(root))
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "one")
    first = _git(root, "rev-parse", "HEAD")
    _git(root, "checkout", "-qb", "feature")
    (root / "src" / "cifar.py").write_text("print('feature')\n")
    _git(root, "commit", "-qam", "two")
    _git(root, "checkout", "-q", "main")
    return root, first


def test_git_config_clones_branch_then_commit(tmp_path, repo):
    root, first = repo
    args = job(tmp_path, source_dir="src", git_config={"repo": f"file://{root}", "branch": "feature"})
    code = Path(validate_job(args).config.source_dir)
    assert (code / "cifar.py").read_text() == "print('feature')\n"
    args["git_config"] = {"repo": str(root), "branch": "feature", "commit": first}
    assert (Path(validate_job(args).config.source_dir) / "cifar.py").read_text() == "print('first')\n"


def test_git_config_failures_name_the_field(tmp_path, repo):
    root, _ = repo
    found = issues_of(job(tmp_path, source_dir="src", git_config={"repo": str(root), "branch": "nope"}))
    assert "name a branch that exists" in found["git_config.branch"]
    found = issues_of(job(tmp_path, source_dir="lib", git_config={"repo": str(root)}))
    assert "is not a directory of" in found["source_dir"]


def test_git_credentials_never_appear_in_errors(tmp_path):
    secret = "ghp_SECRETTOKEN123"
    with pytest.raises(ConfigError) as err:
        validate_job(job(tmp_path, git_config={"repo": "https://127.0.0.1:9/x.git", "token": secret}))
    assert secret not in str(err.value) and "git_config.repo" in str(err.value)
