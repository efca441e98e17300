"""One table of the backends (launcher.config.backend_table): every list of backends derives from it,
so a new backend is one row there plus its own modules (docs/architecture.md, "Where a new thing goes").

A fake backend is added to the table (its row, class, section, rules and image: tests.support.fifth_backend)
and shows up in the job schema's choices and sections, the rules, the CLI's `--backend` choices, `smlaunch
list` and the job handles; then, with the launcher imported afresh with the row (as if it were in the
table's source), it is followed through every command: validate, plan, submit --dry-run, submit, status
(its checkpoint), logs and --diagnostics, metrics, list, stop, warm-pool (refused), tune (where its row says
sweeps run), and both SDK faces with its section (dryrun, fit, attach). Each holds a control without the
row, or with the row saying otherwise."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from launcher.backends import registry
from launcher.backends.base import BackendError
from launcher.cli.app import main
from launcher.config import JobFile, backend_rules, backend_table
from launcher.wire.training.base import Strict
from launcher.wire.training.issues import ConfigError
from tests.support.fifth_backend import FakeBackend, FakeSettings, fake_row, fresh_launcher, has_the_interface
from tests.support.train_runs import ROOT


@pytest.fixture
def fake(monkeypatch):
    FakeBackend.reset()
    monkeypatch.setattr(backend_table, "BACKENDS", (*backend_table.BACKENDS, fake_row()))


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
    monkeypatch.setattr(backend_table, "BACKENDS", (*backend_table.BACKENDS, replace(fake_row(), in_job_store=True)))
    assert "not a local, slurm, kubernetes or fake job (in " in _not_found()
    # the control: a backend whose jobs are not in the store (SageMaker, asked after) is not named as one
    assert "sagemaker job" not in _not_found()


def test_without_the_row_a_handle_of_the_backend_is_refused():
    with pytest.raises(ConfigError, match="names backend 'fake', which smlaunch does not have"):
        registry.parse_handle("fake:1234")
    assert registry.handle_fix() == "name a job as NAME, sagemaker:NAME, local:NAME, slurm:JOBID or kubernetes:NAME"


# --- a fifth backend through every command: its row and its own files (tests.support.fifth_backend) ---------

def _fake_job_file(directory, **fields) -> str:
    path = directory / "fake.yaml"
    path.write_text(json.dumps({
        "entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "ml.p4d.24xlarge",
        "instance_count": 1, "backend": "fake", "fake": {"zone": "b"}, "distribution": {"torch_distributed":
        {"enabled": True}}, "hyperparameters": {"model_preset": "llama3-tiny", "lr": 0.01, "max_steps": 20}, **fields}))
    return str(path)


def cli(*args: str):
    """`smlaunch ...` of the launcher the test runs in (fresh_launcher's, once entered)."""
    return CliRunner().invoke(importlib.import_module("launcher.cli.app").main, list(args))


@pytest.fixture
def fifth(home, tmp_path):
    """The launcher imported afresh with the fake row in its table, and a job file of the fake backend."""
    path = _fake_job_file(tmp_path)
    with fresh_launcher():
        yield path


def test_the_fifth_backends_class_has_the_whole_interface():
    has_the_interface(FakeBackend)
    with pytest.raises(AssertionError, match="metrics"):  # the control: a class without one of the methods
        has_the_interface(type("Lacking", (FakeBackend,), {"metrics": None}))


def test_without_the_row_a_job_file_of_the_backend_is_refused(home, tmp_path):
    """The control of the tests below: the launcher as it is names no backend fake."""
    result = cli("validate", _fake_job_file(tmp_path))
    assert result.exit_code == 2 and 'backend = "fake"' in result.output and "Traceback" not in result.output


def test_a_fifth_backend_is_validated_planned_and_dry_run(fifth):
    checked = cli("validate", fifth, "--json")
    assert checked.exit_code == 0, checked.output
    summary = json.loads(checked.stdout)["summary"]
    assert (summary["backend"], summary["image"]) == ("fake", "the fake engine's own image in zone b")
    refused = cli("validate", fifth, "--set", "fake.zone=z")  # its own rules
    assert refused.exit_code == 2 and 'fake.zone = "z": is the fake backend\'s own rule' in refused.output
    planned = cli("plan", fifth)
    assert planned.exit_code == 0 and "ml.p4d.24xlarge" in planned.stdout, planned.output
    shown = cli("submit", fifth, "--dry-run", "--job-name", "fake-dry")
    assert shown.exit_code == 0 and json.loads(shown.stdout) == {"FakeJob": {"TrainingJobName": "fake-dry",
                                                                              "Zone": "b"}}
    assert list(FakeBackend.jobs) == ["fake-1"]  # a dry run starts nothing


def test_a_fifth_backends_job_is_submitted_followed_and_stopped(fifth):
    submitted = cli("submit", fifth, "--job-name", "fake-2")
    assert submitted.exit_code == 0, submitted.output
    assert "submitted fake-2 (fake, zone b)" in submitted.stdout and "fake-2 completed" in submitted.stdout
    status = cli("status", "fake:fake-2")
    assert status.exit_code == 0 and "backend: fake" in status.stdout
    assert "last checkpoint: step 20, fake://fake-2/checkpoints/step-20" in status.stdout
    assert cli("logs", "fake:fake-2").stdout == "[fake-2] trained in zone b\n"
    assert cli("logs", "fake:fake-2", "--diagnostics").stdout == "job fake-2's output data is in the fake engine's " \
                                                                  "zone b\n"
    metrics = json.loads(cli("metrics", "fake:fake-2", "--json").stdout)
    assert [r["val_loss"] for r in metrics[0]["records"]] == [1.01, 0.01]
    listed = json.loads(cli("list", "--backend", "fake", "--json").stdout)["jobs"]
    assert [j["Handle"] for j in listed] == ["fake:fake-1", "fake:fake-2"]
    ended = cli("stop", "fake:fake-2")
    assert ended.exit_code == 1 and "fake job fake-2 has already ended" in ended.stderr
    FakeBackend.jobs["fake-3"] = {**FakeBackend.jobs["fake-2"], "TrainingJobStatus": "InProgress"}  # still running
    assert cli("stop", "fake:fake-3").stdout == "stopping fake-3 (fake)\n"
    pool = cli("warm-pool", "update", "fake:fake-3", "--keep-alive", "60")
    assert pool.exit_code == 2 and "fake-3 is a fake job: warm pools are SageMaker's" in pool.stderr


def test_a_fifth_backend_runs_sweeps_where_its_row_says(fifth, monkeypatch, tmp_path):
    tuning = {"objective": {"metric": "validation:loss", "type": "Minimize"}, "strategy": "Grid",
              "max_parallel_jobs": 2, "ranges": {"lr": {"kind": "categorical", "values": [0.02, 0.01]}}}
    path = _fake_job_file(tmp_path, tuning=tuning)
    swept = cli("tune", path, "--name", "fake-sweep")
    assert swept.exit_code == 0, swept.output
    trials = {job["LossAt20"]: name for name, job in FakeBackend.jobs.items() if name.startswith("fake-sweep")}
    assert sorted(trials) == [0.01, 0.02]
    status = json.loads(cli("status", "fake-sweep", "--json").stdout)
    assert status["BestTrainingJob"]["TrainingJobName"] == trials[0.01]
    # the control: a row that says its sweeps do not run there
    table = importlib.import_module("launcher.config.backend_table")
    monkeypatch.setattr(table, "BACKENDS", tuple(replace(r, sweeps=False) if r.name == "fake" else r
                                                 for r in table.BACKENDS))
    refused = cli("tune", path, "--name", "fake-sweep-2")
    assert refused.exit_code == 2 and 'backend = "fake": runs no sweeps' in refused.stderr


def test_a_fifth_backend_in_both_sdk_faces(fifth):
    sdk = importlib.import_module("launcher")
    est = sdk.PyTorch(entry_point="train.py", source_dir=str(ROOT / "entrypoints"), instance_type="ml.p4d.24xlarge",
                      hyperparameters={"model_preset": "llama3-tiny", "lr": 0.01}, backend="fake", fake={"zone": "c"},
                      distribution={"torch_distributed": {"enabled": True}})
    assert est.dryrun(job_name="fake-sdk") == {"FakeJob": {"TrainingJobName": "fake-sdk", "Zone": "c"}}
    est.fit(job_name="fake-sdk")
    attached = sdk.PyTorch.attach("fake:fake-sdk").config
    assert (attached.backend, attached.fake.zone, attached.hyperparameters.lr) == ("fake", "c", 0.01)
    v3 = importlib.import_module("launcher.sdk.model_trainer")
    trainer = v3.ModelTrainer(source_code=v3.SourceCode(source_dir=str(ROOT / "entrypoints"), entry_script="train.py"),
                              compute=v3.Compute(instance_type="ml.p4d.24xlarge"), distributed=v3.Torchrun(),
                              hyperparameters={"model_preset": "llama3-tiny"}, training_image="repo/img:1",
                              backend="fake", fake={"zone": "d"})
    assert trainer.dryrun(job_name="fake-v3") == {"FakeJob": {"TrainingJobName": "fake-v3", "Zone": "d"}}
