"""SDK v2 estimator arguments that smlaunch refuses, or checks beyond what the SDK checks: each
error names the field, the value and the fix. And git_config, cloned from a real repository.
Here the tests that start processes; the rest are tests/unit/test_sdk_settings.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher import PyTorch
from launcher.config import validate_job
from launcher.wire.training.issues import ConfigError
from tests.support.sdk_settings import issues_of, job


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


def test_rule_actions_are_refused(tmp_path):
    sagemaker = pytest.importorskip("sagemaker")
    from sagemaker.debugger import Rule, rule_configs

    actions = rule_configs.ActionList(rule_configs.StopTraining())
    rule = Rule.sagemaker(rule_configs.loss_not_decreasing(), actions=actions)
    assert sagemaker
    with pytest.raises(ConfigError, match="rule actions"):
        PyTorch(**job(tmp_path), rules=[rule])
