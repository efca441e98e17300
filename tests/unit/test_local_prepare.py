"""Preparing a local job fails before the expensive part, and leaves nothing half-made.

Where the job will write (the jobs root, a local output_path, a local checkpoint_local_path) is
probed before anything is written; a full disk while the job directory is filled either removes
the directory (no record yet) or records the job Failed with the reason, never a job that stays
"InProgress (Starting)" and blocks its name.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.backends.base import BackendError
from launcher.cli.app import main
from launcher.config import validate_job
from launcher.local import prepare as prepare_module
from launcher.local import store
from launcher.local.prepare import MIN_FREE_BYTES, prepare
from launcher.local.process import ProcessRunner
from launcher.wire.training.issues import ConfigError

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def src(tmp_path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "job.py").write_text("print('hi')\n")
    return tmp_path / "src"


def local_job(src: Path, **fields):
    return validate_job({"entry_point": "job.py", "source_dir": str(src), "instance_type": "local", **fields})


def run_prepare(job, name: str = "j"):
    return prepare(job, ProcessRunner(), job_name=name, log=lambda _: None)


def fail(exc: OSError):
    def raise_(*args, **kwargs):
        raise exc

    return raise_


# --- checked before anything is written ---------------------------------------------------------------
def test_unwritable_places_are_all_reported_before_anything_is_written(home, src, tmp_path):
    (tmp_path / "a-file").write_text("")
    job = local_job(src, output_path="/sys/smlaunch-out", checkpoint_local_path=str(tmp_path / "a-file" / "ckpt"))
    with pytest.raises(ConfigError) as info:
        run_prepare(job)
    by_field = {i.path: i for i in info.value.issues}
    assert "/sys/smlaunch-out cannot be written" in by_field["output_path"].problem
    assert "a-file is a file, not a directory" in by_field["checkpoint_local_path"].problem
    assert "SMLAUNCH_HOME" not in by_field
    assert not home.exists() and not (tmp_path / "a-file").is_dir()


def test_an_unwritable_home_is_refused(monkeypatch, src):
    monkeypatch.setenv("SMLAUNCH_HOME", "/sys/smlaunch-home")
    with pytest.raises(ConfigError) as info:
        run_prepare(local_job(src))
    assert info.value.issues[0].path == "SMLAUNCH_HOME"
    assert "cannot be written" in info.value.issues[0].problem


def test_a_full_disk_is_refused_before_the_job_starts(home, src, monkeypatch):
    class Usage:
        free = MIN_FREE_BYTES - 1

    monkeypatch.setattr(prepare_module.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(ConfigError, match=f"has {MIN_FREE_BYTES - 1:,} bytes free"):
        run_prepare(local_job(src))
    assert not (home / "jobs" / "j").exists()


def test_probes_leave_nothing_behind(home, src, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_prepare(local_job(src, output_path=str(out)))
    assert list(out.iterdir()) == []
    assert [p.name for p in (home / "jobs").iterdir()] == ["j"]
    assert (home / "jobs" / "j").stat().st_mode & 0o777 == 0o700  # others cannot read a job's secrets


# --- a failure while writing ------------------------------------------------------------------------
def test_no_space_before_the_record_removes_the_directory_and_frees_the_name(home, src, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(store, "write", fail(NO_SPACE))
        with pytest.raises(BackendError, match="could not prepare local job j.*No space left on device"):
            run_prepare(local_job(src))
    assert not (home / "jobs" / "j").exists()
    assert run_prepare(local_job(src)).name == "j"  # the name is free again


def test_no_space_after_the_record_records_the_job_failed(home, src, monkeypatch):
    monkeypatch.setattr(prepare_module, "write_opt_ml", fail(NO_SPACE))
    with pytest.raises(BackendError, match="No space left on device"):
        run_prepare(local_job(src))
    record = json.loads((home / "jobs" / "j" / "job.json").read_text())
    assert record["TrainingJobStatus"] == "Failed" and record["SecondaryStatus"] == "Failed"
    assert "No space left on device" in record["FailureReason"]


def test_when_not_even_the_failure_can_be_recorded_the_job_is_removed(home, src, monkeypatch):
    real_write = store.write_private
    writes = []

    def write_once(path, text):  # the first record fits; then the disk is full, the reserve too small
        if writes:
            raise NO_SPACE
        writes.append(text)
        real_write(path, text)

    monkeypatch.setattr(store, "write_private", write_once)
    monkeypatch.setattr(prepare_module, "write_opt_ml", fail(NO_SPACE))
    with pytest.raises(BackendError, match="No space left on device"):
        run_prepare(local_job(src))
    assert writes and not (home / "jobs" / "j").exists()


def test_the_cli_reports_a_full_disk_in_one_line(home, src, monkeypatch):
    monkeypatch.setattr(prepare_module, "write_opt_ml", fail(NO_SPACE))
    job_file = src.parent / "job.yaml"
    job_file.write_text(f"entry_point: job.py\nsource_dir: {src}\ninstance_type: local\n")
    result = CliRunner().invoke(main, ["submit", str(job_file), "--job-name", "full"])
    assert result.exit_code == 1, result.output
    assert "could not prepare local job full" in result.stderr and "No space left on device" in result.stderr
    assert "Traceback" not in result.output
    assert json.loads((home / "jobs" / "full" / "job.json").read_text())["TrainingJobStatus"] == "Failed"
