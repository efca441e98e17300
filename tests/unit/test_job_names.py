"""Job names: SageMaker's rule (1-63 of [a-zA-Z0-9-], no leading or trailing '-') is checked
wherever a name reaches the file system or AWS, before anything is created or called."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.backends.base import BackendError
from launcher.cli.app import main
from launcher.config import validate_job
from launcher.config.job_names import check_job_name, make_job_name
from launcher.local import prepare as prepare_module
from launcher.local.prepare import prepare
from launcher.local.process import ProcessRunner
from launcher.wire.training.issues import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "configs" / "seed" / "p4d-cp8.yaml"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def local_job(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "job.py").write_text("print('hi')\n")
    return validate_job({"entry_point": "job.py", "source_dir": str(tmp_path / "src"), "instance_type": "local"})


@pytest.fixture
def no_sagemaker(monkeypatch):
    """Any use of the SageMaker backend fails the test: bad names must not reach AWS."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("the SageMaker backend was used")

    monkeypatch.setattr("launcher.backends.sagemaker.SageMakerBackend.__init__", refuse)


@pytest.mark.parametrize("name", ["a", "my-job-1", "a--b", "A" * 63, "0-x"])
def test_valid_names(name):
    assert check_job_name(name) == name


@pytest.mark.parametrize("name,problem", [
    ("../../escaped-job", "contains '.', '/'"),
    ("a" * 70, "is 70 characters long; SageMaker allows 63"),
    ("a_b", "contains '_'"),
    ("a/b", "contains '/'"),
    ("-a", "starts or ends with '-'"),
    ("a-", "starts or ends with '-'"),
    ("", "is empty"),
    ("a\n", "contains '\\n'"),
    (5, "is not text (int)"),
])
def test_invalid_names_say_why_and_how(name, problem):
    with pytest.raises(ConfigError) as info:
        check_job_name(name, field="--job-name")
    issue = info.value.issues[0]
    assert issue.path == "--job-name" and issue.value == name
    assert issue.problem == problem
    assert "1-63 letters, digits and hyphens" in issue.fix


@settings(max_examples=200, deadline=None)
@given(base=st.text(max_size=80))
def test_generated_names_are_valid(base):
    assert check_job_name(make_job_name(base))


# --- the CLI ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../escaped-job", "x" * 70, "under_score"])
def test_submit_refuses_a_bad_job_name_before_anything_is_written(home, local_job, tmp_path, name, no_sagemaker):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("entry_point: job.py\nsource_dir: src\ninstance_type: local\n")
    for args in (["submit", str(job_file)], ["submit", str(SEED), "--dry-run"]):
        result = CliRunner().invoke(main, [*args, "--job-name", name])
        assert result.exit_code == 2, result.output
        assert "--job-name = " in result.stderr and "Traceback" not in result.output
    assert not home.exists() and not (tmp_path.parent / "escaped-job").exists()


@pytest.mark.parametrize("command", ["status", "logs", "stop"])
@pytest.mark.parametrize("name", ["../jobs/x", "x" * 64, "a_b"])
def test_status_logs_stop_refuse_a_bad_name_without_aws(home, command, name, no_sagemaker):
    result = CliRunner().invoke(main, [command, name])
    assert result.exit_code == 2, result.output
    assert "job_name = " in result.stderr and "Traceback" not in result.output


# --- the backends ---------------------------------------------------------------------------------
def test_local_prepare_refuses_a_bad_name_and_writes_nothing(home, local_job):
    with pytest.raises(ConfigError, match="job_name"):
        prepare(local_job, ProcessRunner(), job_name="../../escaped-job", log=lambda _: None)
    assert not home.exists()


def test_sagemaker_dryrun_refuses_a_bad_name(fake_credentials, no_network):
    from launcher.backends.sagemaker import SageMakerBackend
    from launcher.config.jobfile import validate_job_file

    job = validate_job_file(SEED)
    with pytest.raises(ConfigError, match="job_name"):
        SageMakerBackend(region="us-east-1").dryrun(job, "bad_name", build=False)


def test_of_two_jobs_of_one_name_exactly_one_gets_the_directory(home, local_job, monkeypatch):
    """The other job creates the directory after this one's early check: this one is refused
    with the usual message, and the other job's directory is left as it was."""
    real_build = prepare_module.build_job_sourcedir
    winner = home / "jobs" / "racing"

    def build_while_the_other_job_starts(job, dest):
        winner.mkdir(parents=True)
        (winner / "job.json").write_text("{}")
        return real_build(job, dest)

    monkeypatch.setattr(prepare_module, "build_job_sourcedir", build_while_the_other_job_starts)
    with pytest.raises(BackendError, match="job_name 'racing' is already used by a local job"):
        prepare(local_job, ProcessRunner(), job_name="racing", log=lambda _: None)
    assert sorted(p.name for p in winner.iterdir()) == ["job.json"]
