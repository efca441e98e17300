"""`smlaunch warm-pool update|terminate` and `smlaunch status`'s warm-pool line, with SageMaker's client
stubbed by botocore's Stubber (moto has no UpdateTrainingJob)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import Stubber
from click.testing import CliRunner

from launcher.backends.sagemaker import SageMakerBackend
from launcher.cli.app import main
from launcher.wire.training.base import KEEP_ALIVE_MAX
from tests.unit.test_warm_pools import REGION, _describe, _update_sent


@pytest.fixture
def stubber(monkeypatch, tmp_path):
    """Every SageMakerBackend the CLI makes gets this stubbed client; no other AWS client is made."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    client = boto3.Session(region_name=REGION).client("sagemaker")

    def only_sagemaker(self, name):
        assert name == "sagemaker", f"the command asked for {name}"
        return client

    monkeypatch.setattr(SageMakerBackend, "client", only_sagemaker)
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _available(stubber, ended=None) -> None:
    stubber.add_response("describe_training_job", _describe(pool={"Status": "Available"}, **(
        {"ended": ended} if ended else {})), {"TrainingJobName": "run-1"})


def test_update_sends_the_new_keep_alive(stubber) -> None:
    _available(stubber)
    _update_sent(stubber, "run-1", 900)
    result = run_cli("warm-pool", "update", "sagemaker:run-1", "--keep-alive", 900)
    assert result.exit_code == 0, result.output
    assert "warm pool of run-1: keep-alive 1800 s -> 900 s" in result.output


def test_terminate_sends_zero(stubber) -> None:
    _available(stubber)
    _update_sent(stubber, "run-1", 0)
    result = run_cli("warm-pool", "terminate", "sagemaker:run-1")
    assert result.exit_code == 0, result.output
    assert "terminating the warm pool of run-1" in result.output


def test_terminate_of_a_terminated_pool_exits_2_and_sends_nothing(stubber) -> None:
    stubber.add_response("describe_training_job", _describe(pool={"Status": "Terminated"}),
                         {"TrainingJobName": "run-1"})
    result = run_cli("warm-pool", "terminate", "sagemaker:run-1")
    assert result.exit_code == 2
    assert "run-1 is Terminated" in result.output and "Traceback" not in result.output


def test_a_job_without_a_pool_exits_2(stubber) -> None:
    stubber.add_response("describe_training_job", _describe(keep_alive=None), {"TrainingJobName": "run-1"})
    result = run_cli("warm-pool", "update", "sagemaker:run-1", "--keep-alive", 60)
    assert result.exit_code == 2 and "run-1 has no warm pool" in result.output


@pytest.mark.parametrize("seconds", [-5, KEEP_ALIVE_MAX + 1])
def test_keep_alive_out_of_range_exits_2_before_asking_aws(stubber, seconds) -> None:
    result = run_cli("warm-pool", "update", "sagemaker:run-1", "--keep-alive", seconds)
    assert result.exit_code == 2
    assert f"--keep-alive = {seconds}" in result.output and f"0 to {KEEP_ALIVE_MAX}" in result.output


@pytest.mark.parametrize("handle", ["local:run-1", "slurm:42"])
def test_a_job_of_another_backend_exits_2(stubber, handle) -> None:
    result = run_cli("warm-pool", "terminate", handle)
    assert result.exit_code == 2 and "warm pools are SageMaker's" in result.output


def test_status_shows_the_pool_and_its_time_left(stubber, monkeypatch) -> None:
    monkeypatch.setattr(SageMakerBackend, "progress", lambda self, name: None)  # CloudWatch: not the subject
    monkeypatch.setattr(SageMakerBackend, "checkpoint", lambda self, name: None)
    monkeypatch.setattr(SageMakerBackend, "restarts", lambda self, name: [])  # its output.tar.gz: not either
    monkeypatch.setattr(SageMakerBackend, "goodput", lambda self, name: None)
    ended = datetime.now(timezone.utc) - timedelta(seconds=600)
    _available(stubber, ended)
    result = run_cli("status", "sagemaker:run-1")
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("warm pool: "))
    shown = re.fullmatch(r"warm pool: Available, (\d+):(\d\d):(\d\d) left of 1800 s keep-alive", line)
    assert shown, line
    hours, minutes, seconds = (int(g) for g in shown.groups())
    # 1800 s less the 600 s since the job ended, less the seconds the test itself took
    assert 1200 - 60 <= hours * 3600 + minutes * 60 + seconds <= 1200
    stubber.add_response("describe_training_job", _describe(), {"TrainingJobName": "run-1"})
    control = run_cli("status", "sagemaker:run-1")
    assert "warm pool" not in control.output


def test_list_has_a_warm_pool_column_only_where_a_job_has_a_pool() -> None:
    from rich.console import Console

    from launcher.cli.jobview import jobs_table

    def rendered(jobs) -> str:
        console = Console(width=120, record=True)
        console.print(jobs_table(jobs, 120))
        return console.export_text()

    jobs = [{"Handle": "sagemaker:run-2", "TrainingJobStatus": "Completed", "WarmPoolStatus": {"Status": "Available"}},
            {"Handle": "local:run-1", "TrainingJobStatus": "Completed"}]
    text = rendered(jobs)
    assert "warm pool" in text.splitlines()[0]
    assert "Available" in next(line for line in text.splitlines() if "run-2" in line)
    assert "warm pool" not in rendered(jobs[1:])  # control: no job with a pool, no column
