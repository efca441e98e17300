"""A lean code bundle (issue 30; launcher/backends/sourcedir.py): a user script's bundle holds its
own code and nothing of smlaunch, and smlaunch's runtime ships under `_smlaunch/`, where it shadows
no package of the user's; `submit` and its dry run say what the bundle holds. Here the tests that run
in one process; the jobs are tests/integration/test_lean_bundle.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.backends.sourcedir import build_job_sourcedir
from launcher.cli.app import main
from launcher.config import validate_job
from tests.support.sourcedir import ROOT, write

BUCKET = "s3://sagemaker-us-east-1-111122223333/own"
ROLE = "arn:aws:iam::111122223333:role/SageMakerRole"


def user_script(tmp_path: Path, **packages: str) -> Path:
    """A user's source_dir: a script, a helper, and packages of the given names."""
    src = tmp_path / "src"
    write(src / "job.py", "import helper\nprint(helper.X)\n")
    write(src / "helper.py", "X = 1\n")
    for name, text in packages.items():
        write(src / name / "__init__.py", text)
    return src


def job(source_dir: Path, entry_point: str = "job.py", **fields):
    return validate_job({"entry_point": entry_point, "source_dir": str(source_dir), **fields})


SAGEMAKER = {"instance_type": "ml.g5.xlarge", "framework_version": "2.8.0", "py_version": "py312"}


@pytest.mark.parametrize("target", [SAGEMAKER, {"instance_type": "local"},
                                    {**SAGEMAKER, "image_uri": "smlaunch:latest"}],
                         ids=["aws-image", "local", "smlaunch-image"])
def test_a_user_scripts_bundle_is_its_source_dir_and_nothing_of_smlaunch(tmp_path, target):
    src = user_script(tmp_path)
    bundle = build_job_sourcedir(job(src, **target), tmp_path / "sourcedir.tar.gz")
    assert bundle.files == ["helper.py", "job.py"]
    assert bundle.smlaunch.startswith("nothing of smlaunch (a user script")
    assert bundle.summary() == (f"sourcedir.tar.gz: 2 files, {bundle.size_bytes} bytes; nothing of smlaunch (a user "
                                "script: what runs it is in the image or on the machine)")


def test_a_users_container_and_launcher_packages_ship_as_they_are(tmp_path):
    src = user_script(tmp_path, container="WHO = 'user container'\n", launcher="WHO = 'user launcher'\n")
    bundle = build_job_sourcedir(job(src, instance_type="local"), tmp_path / "sourcedir.tar.gz")
    assert bundle.files == ["container/__init__.py", "helper.py", "job.py", "launcher/__init__.py"]
    import tarfile

    with tarfile.open(bundle.path) as tar:
        assert tar.extractfile("container/__init__.py").read() == b"WHO = 'user container'\n"


@pytest.mark.parametrize("target", [{"instance_type": "ml.p5.48xlarge"}, {"instance_type": "local"}],
                         ids=["aws-image", "local"])
def test_the_runtime_ships_under_a_name_that_shadows_nothing(tmp_path, target):
    hps = {"model_preset": "llama3-tiny", "max_context_width": 256}
    bundle = build_job_sourcedir(job(ROOT / "entrypoints", "train.py", hyperparameters=hps, **target),
                                 tmp_path / "sourcedir.tar.gz")
    top = {name.split("/")[0] for name in bundle.files}
    assert top - {"requirements.txt"} == {"train.py", "_smlaunch"}  # no container/ or launcher/ at the root
    shipped = {name.removeprefix("_smlaunch/") for name in bundle.files if name.startswith("_smlaunch/")}
    assert {"container/trainer.py", "container/toolkit/bootstrap.py", "launcher/__init__.py",
            "launcher/wire/training/hyperparameters.py", "launcher/wire/masking.py"} <= shipped
    # of the launcher, only the contract the training container imports (docs/architecture.md)
    assert {name.split("/")[1] for name in shipped if name.startswith("launcher/")} == {"__init__.py", "wire"}
    assert not [name for name in bundle.files if "__pycache__" in name]
    assert bundle.smlaunch == (f"smlaunch's runtime in _smlaunch/ ({len(shipped)} files: container, launcher.wire), "
                               "which train.py imports")


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_submit_dry_run_says_what_the_bundle_holds(tmp_path, monkeypatch, fake_credentials):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    src = user_script(tmp_path, container="WHO = 'user'\n")
    file = tmp_path / "job.yaml"
    file.write_text(json.dumps({"entry_point": "job.py", "source_dir": str(src), **SAGEMAKER, "role": ROLE,
                                "output_path": BUCKET}))
    shown = run_cli("submit", file, "--dry-run", "--job-name", "own-1")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["SourceBundle"]["files"] == 3
    assert "sourcedir.tar.gz: 3 files, " in shown.stderr and "; nothing of smlaunch (a user script" in shown.stderr
    on_this_machine = tmp_path / "local.yaml"
    on_this_machine.write_text(json.dumps({"entry_point": "job.py", "source_dir": str(src), **SAGEMAKER}))
    local = run_cli("submit", on_this_machine, "--dry-run", "--local")
    assert local.exit_code == 0, local.output
    request = json.loads(local.stdout)
    assert request["SourceBundle"]["files"] == 3 and "LocalJob" in request
    assert "sourcedir.tar.gz: 3 files, " in local.stderr
    assert not (tmp_path / "home").exists()  # a dry run writes nothing

    slurm = run_cli("submit", on_this_machine, "--dry-run", "--backend", "slurm", "--set", "instance_type=local")
    assert slurm.exit_code == 0, slurm.output
    assert slurm.stdout.startswith("#!/bin/bash") and "sourcedir.tar.gz: 3 files, " in slurm.stderr

    runtime = run_cli("submit", ROOT / "configs" / "seed" / "p4d-cp8.yaml", "--dry-run", "--job-name", "rt-1")
    assert runtime.exit_code == 0, runtime.output
    summary = json.loads(runtime.stdout)["SourceBundle"]
    assert summary["smlaunch"].startswith("smlaunch's runtime in _smlaunch/")
    assert f"sourcedir.tar.gz: {summary['files']} files, " in runtime.stderr


def test_the_estimators_dry_run_says_what_the_bundle_holds(tmp_path, monkeypatch, fake_credentials):
    from launcher import PyTorch

    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    src = user_script(tmp_path)
    shown = PyTorch(entry_point="job.py", source_dir=str(src), instance_type="local", role=ROLE,
                    framework_version="2.8.0", py_version="py312").dryrun()
    assert shown["SourceBundle"]["files"] == 2 and shown["SourceBundle"]["smlaunch"].startswith("nothing of smlaunch")
    runtime = PyTorch(entry_point="train.py", source_dir=str(ROOT / "entrypoints"), instance_type="local", role=ROLE,
                      hyperparameters={"model_preset": "llama3-tiny", "max_context_width": 64}).dryrun()
    assert runtime["SourceBundle"]["smlaunch"].startswith("smlaunch's runtime in _smlaunch/")
    assert runtime["SourceBundle"]["files"] > 90


def test_only_the_runtimes_bundle_carries_the_plans_prediction_and_a_local_job_says_why_it_has_none(tmp_path):
    """launcher.wire.job_plan: what the runtime's trackers show of the plan (tests/integration/
    test_trackers.py follows it into W&B and MLflow); a user script has no smlaunch trackers."""
    import tarfile

    from launcher.plan.configurations import LOCAL_JOB
    from launcher.wire import job_plan

    runtime = build_job_sourcedir(job(ROOT / "entrypoints", "train.py", instance_type="local",
                                      hyperparameters={"model_preset": "llama3-tiny"}), tmp_path / "r.tar.gz")
    assert f"_smlaunch/{job_plan.FILE}" in runtime.files
    with tarfile.open(runtime.path) as tar:
        shipped = json.loads(tar.extractfile(f"_smlaunch/{job_plan.FILE}").read())
    assert shipped["nothing_planned"] == LOCAL_JOB and shipped["instance_type"] == "local"
    own = build_job_sourcedir(job(user_script(tmp_path), instance_type="local"), tmp_path / "u.tar.gz")
    assert not any(name.endswith(job_plan.FILE) for name in own.files)


def test_a_planner_that_fails_does_not_stop_the_bundle_and_the_prediction_says_why(tmp_path, monkeypatch, caplog):
    import logging
    import tarfile

    from launcher.plan import prediction
    from launcher.wire import job_plan

    def broken(job, advise):
        raise ZeroDivisionError("a planner bug")

    monkeypatch.setattr(prediction, "plan", broken)
    with caplog.at_level(logging.WARNING):
        bundle = build_job_sourcedir(job(ROOT / "entrypoints", "train.py", instance_type="local",
                                         hyperparameters={"model_preset": "llama3-tiny"}), tmp_path / "r.tar.gz")
    with tarfile.open(bundle.path) as tar:
        shipped = json.loads(tar.extractfile(f"_smlaunch/{job_plan.FILE}").read())
    assert shipped["nothing_planned"].startswith("the planner failed (ZeroDivisionError: a planner bug)")
    assert any("the job's trackers get no prediction" in r.getMessage() for r in caplog.records)
