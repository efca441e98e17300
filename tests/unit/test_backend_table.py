"""One table of the backends (launcher.config.backend_table): every list of backends derives from it,
so a new backend is one row there plus its own modules (docs/architecture.md, "Where a new thing goes").

A fake backend is added to the table (its class, section and rules live in this module) and shows up in
the job schema's choices and sections, the rules, the CLI's `--backend` choices, `smlaunch list` and
the job handles; each test also holds the control without the row."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from pydantic import Field, ValidationError

from launcher.backends import registry
from launcher.backends.base import BackendError
from launcher.cli.app import main
from launcher.config import JobFile, backend_rules, backend_table
from launcher.wire.training.base import Strict
from launcher.wire.training.issues import ConfigError, Issue

HERE = __name__


class FakeSettings(Strict):
    zone: str = Field("a", description="The fake engine's zone.")


def fake_rules(ctx) -> list[Issue]:
    return [Issue("fake.zone", ctx.job.fake.zone, "is the fake backend's own rule", "none")]


class FakeBackend:
    name = "fake"

    def __init__(self, region: str | None):
        self.region = region

    @classmethod
    def create(cls, options):
        return cls(options.region)

    def list(self, status=None, name_contains=None, max_results=50) -> list[dict]:
        return [{"TrainingJobName": "fake-1", "TrainingJobStatus": "Completed",
                 "CreationTime": "2026-11-03T10:00:00+00:00", "TrainingEndTime": "2026-11-03T10:00:10+00:00"}]


FAKE = backend_table.BackendRow(
    "fake", f"{HERE}:FakeBackend", "any", restarts="the fake engine restarts nothing",
    settings=f"{HERE}:FakeSettings", settings_description="backend: fake: its zone",
    rules=f"{HERE}:fake_rules", job_ids=True, in_job_store=False)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(backend_table, "BACKENDS", (*backend_table.BACKENDS, FAKE))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    for key in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def _backend_enum(model) -> list[str]:
    return model.model_json_schema()["properties"]["backend"]["anyOf"][0]["enum"]


def test_the_job_file_takes_the_tables_backends_and_sections():
    # the job file as built on import: the four backends, and the two sections (slurm, kubernetes) among them
    assert _backend_enum(JobFile) == ["sagemaker", "local", "slurm", "kubernetes"]
    assert {b.name for b in backend_table.with_sections()} == {"slurm", "kubernetes"}
    assert "slurm" in JobFile.model_fields and "kubernetes" in JobFile.model_fields


def test_a_new_backend_reaches_the_job_schema(fake):
    built = backend_table.with_backends("Probe", Strict)
    assert _backend_enum(built) == ["sagemaker", "local", "slurm", "kubernetes", "fake"]
    assert built(backend="fake", fake={"zone": "b"}).fake.zone == "b"
    with pytest.raises(ValidationError, match="fake.zone"):
        built(fake={"zone": 3})
    # the control: the job file built before the row was added knows no fake backend
    assert "fake" not in _backend_enum(JobFile) and "fake" not in JobFile.model_fields


def _job(backend_name: str, fake: FakeSettings | None = None) -> SimpleNamespace:
    """The fields of a validated job the backend rules read (a local job, so local's own rules pass)."""
    return SimpleNamespace(backend=backend_name, backend_name=backend_name, is_local=True, instance_type="local",
                           slurm=None, kubernetes=None, fake=fake)


def test_a_new_backends_section_and_rules_are_checked(fake):
    settings = FakeSettings(zone="z")
    own = backend_rules.check_backend_choice(SimpleNamespace(job=_job("fake", fake=settings), instance=None))
    assert [(i.path, i.value, i.problem) for i in own] == [("fake.zone", "z", "is the fake backend's own rule")]
    elsewhere = backend_rules.check_backend_choice(SimpleNamespace(job=_job("local", fake=settings), instance=None))
    assert [i.problem for i in elsewhere] == ["is only read by backend fake, and the job runs on local"]
    # the control: a job that names neither the backend nor its section meets none of its rules
    assert backend_rules.check_backend_choice(SimpleNamespace(job=_job("local"), instance=None)) == []


def test_a_new_backend_is_a_cli_choice_and_is_listed(fake, home):
    assert "sagemaker|local|slurm|kubernetes|fake" in CliRunner().invoke(main, ["submit", "--help"]).stdout
    result = CliRunner().invoke(main, ["list", "--backend", "fake", "--json"])
    assert result.exit_code == 0, result.output
    assert [(j["Handle"], j["DurationSeconds"]) for j in json.loads(result.stdout)["jobs"]] == [("fake:fake-1", 10)]
    listed = json.loads(CliRunner().invoke(main, ["list", "--json"]).stdout)  # every backend: fake's too
    assert "fake:fake-1" in [j["Handle"] for j in listed["jobs"]]


def test_without_the_row_the_cli_refuses_the_backend(home):
    result = CliRunner().invoke(main, ["list", "--backend", "fake"])
    assert result.exit_code == 2 and "'fake' is not one of 'sagemaker', 'local', 'slurm', 'kubernetes'" in result.stderr


def test_a_new_backend_names_its_jobs_in_handles(fake):
    assert registry.parse_handle("fake:1234") == ("fake", "1234")  # its engine's own job ids
    backend, job = registry.find("fake:fake-1", region="eu-west-1")
    assert isinstance(backend, FakeBackend) and backend.region == "eu-west-1" and job == "fake-1"
    assert registry.handle_fix().endswith("slurm:JOBID, kubernetes:NAME or fake:JOBID")


def _not_found() -> str:
    """What a bare name no backend has is told, SageMaker unasked (`home`: no region)."""
    with pytest.raises(BackendError) as found:
        registry.find("no-such-job")
    return str(found.value)


def test_a_bare_name_not_found_names_every_backend_of_the_job_store(home, monkeypatch):
    assert "no job named 'no-such-job': not a local, slurm or kubernetes job (in " in _not_found()
    monkeypatch.setattr(backend_table, "BACKENDS", (*backend_table.BACKENDS, replace(FAKE, in_job_store=True)))
    assert "not a local, slurm, kubernetes or fake job (in " in _not_found()
    # the control: a backend whose jobs are not in the store (SageMaker, asked after) is not named as one
    assert "sagemaker job" not in _not_found()


def test_without_the_row_a_handle_of_the_backend_is_refused():
    with pytest.raises(ConfigError, match="names backend 'fake', which smlaunch does not have"):
        registry.parse_handle("fake:1234")
    assert registry.handle_fix() == "name a job as NAME, sagemaker:NAME, local:NAME, slurm:JOBID or kubernetes:NAME"
