"""The estimator takes what a job file can hold, checked as the job file is (issue 31, items 16
and 17): no NUL, no value containing itself, a dry run that sends nothing."""

from __future__ import annotations

import pytest

from launcher import PyTorch
from launcher.wire.training.issues import ConfigError
from tests.support.cli import ROOT

ROLE = "arn:aws:iam::111122223333:role/SageMakerExecutionRole"
HP = {"model_preset": "llama3-tiny", "max_context_width": 64}


def estimator(**changes) -> PyTorch:
    args = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "role": ROLE, "instance_count": 1,
            "instance_type": "ml.p5.48xlarge", "hyperparameters": dict(HP)}
    return PyTorch(**{**args, **changes})


def _self_containing() -> dict:
    hp = dict(HP)
    hp["loop"] = {"inner": hp}
    return hp


def _deep() -> dict:
    hp = dict(HP)
    node = hp["deep"] = {}
    for _ in range(40):
        node = node.setdefault("x", {})
    return hp


@pytest.mark.parametrize("changes,said", [
    ({"environment": {"DB": "pa\0ss"}}, 'environment.DB = "pa\\u0000ss": holds a NUL character'),
    ({"hyperparameters": {**HP, "note": "a\0b"}}, 'hyperparameters.note = "a\\u0000b": holds a NUL character'),
    ({"hyperparameters": {**HP, "na\0me": 1}}, "holds a NUL character"),
    ({"output_path": "s3://bucket/out\0x"}, "output_path = \"s3://bucket/out\\u0000x\": holds a NUL character"),
    ({"hyperparameters": _self_containing()}, "hyperparameters.loop.inner.loop = \"...\": contains itself"),
    ({"hyperparameters": _deep()}, "is nested more than 32 levels deep"),
], ids=["environment-nul", "hyperparameter-nul", "key-nul", "output-path-nul", "self-containing", "deep"])
def test_values_a_job_file_could_not_hold_are_refused(changes, said):
    with pytest.raises(ConfigError) as caught:
        estimator(**changes)
    assert said in str(caught.value)


def test_ordinary_values_are_accepted():
    """Control: the same estimator with plain values."""
    job = estimator(environment={"DB": "pass"}, hyperparameters={**HP, "note": "a b", "nested": {"x": [1, 2]}}).job
    assert job.config.environment == {"DB": "pass"}


def test_a_dry_run_without_output_path_sends_nothing(monkeypatch, tmp_path):
    """Issue 31, item 17: the default bucket needs the account (an STS call with credentials): a
    dry run shows a placeholder instead, with no credentials at all and nothing sent."""
    import botocore.client

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    sent = []
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call",
                        lambda self, operation, params: sent.append(operation))
    request = estimator(region="us-east-1").dryrun(job_name="dry-1")["CreateTrainingJob"]
    assert request["OutputDataConfig"]["S3OutputPath"] == "s3://sagemaker-us-east-1-<account-id>/"
    assert request["HyperParameters"]["sagemaker_submit_directory"] == (
        '"s3://sagemaker-us-east-1-<account-id>/dry-1/source/sourcedir.tar.gz"')
    assert sent == []
