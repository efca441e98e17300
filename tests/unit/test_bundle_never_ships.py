"""What a code archive never holds (issue 31, item 8): the job files with their secrets, smlaunch's
own state, credential files reached through a link or named as the clouds name them, and any file
holding one of the job's secret values. Built from a job file, as `smlaunch submit` builds it."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.backends.sourcedir import build_job_sourcedir, build_sourcedir
from launcher.cli.app import main
from launcher.config.jobfile import validate_job_file
from tests.support.sourcedir import write

SECRET = "hf_bundle_secret_9f3a"
JOB = f"""extends: base.yaml
environment: {{HF_TOKEN: {SECRET}}}
output_path: out
checkpoint_local_path: ck
"""
BASE = """entry_point: train.py
source_dir: .
instance_type: local
framework_version: "2.8.0"
py_version: py312
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    """A source_dir that is also where the user keeps the job files, SMLAUNCH_HOME and the outputs."""
    src = tmp_path / "src"
    write(src / "train.py", "print('train')\n")
    write(src / "job.yaml", JOB)
    write(src / "base.yaml", BASE)
    monkeypatch.setenv("SMLAUNCH_HOME", str(src / "state"))
    write(src / "state" / "jobs" / "old" / "job.json", f'{{"Environment": {{"HF_TOKEN": "{SECRET}"}}}}')
    write(src / "out" / "old" / "output" / "model.tar.gz")
    write(src / "ck" / "step_10" / ".complete")
    return src


def _contents(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_job_files_and_smlaunchs_state_are_never_shipped(tree: Path, tmp_path: Path) -> None:
    bundle = build_job_sourcedir(validate_job_file(tree / "job.yaml"), tmp_path / "a.tar.gz")
    contents = _contents(bundle.path)
    assert sorted(contents) == ["train.py"]
    assert not any(SECRET.encode() in data for data in contents.values())
    assert bundle.left_out == ["base.yaml", "ck/", "job.yaml", "out/", "state/"]
    assert bundle.notes[0].startswith("left out of a.tar.gz as the job's own files or smlaunch's state")


def test_outside_source_dir_nothing_is_left_out_for_them(tmp_path: Path, monkeypatch) -> None:
    """Control: the job files, home and outputs elsewhere leave the code as it is."""
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    write(tmp_path / "src" / "train.py")
    write(tmp_path / "src" / "settings.yaml", "lr: 1\n")
    write(tmp_path / "job.yaml", BASE.replace("source_dir: .", "source_dir: src"))
    bundle = build_job_sourcedir(validate_job_file(tmp_path / "job.yaml"), tmp_path / "a.tar.gz")
    assert bundle.files == ["settings.yaml", "train.py"] and bundle.left_out == [] and bundle.notes == []


def test_a_file_holding_a_secret_value_of_the_job_is_refused(tree: Path, tmp_path: Path) -> None:
    write(tree / "conf" / "app.ini", f"[hub]\ntoken = {SECRET}\n")
    result = CliRunner().invoke(main, ["submit", str(tree / "job.yaml"), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert ("'conf/app.ini' in the code holds the value of environment.HF_TOKEN, a secret of this job"
            in result.output)
    assert SECRET not in result.output and "Traceback" not in result.output


def test_a_secret_cut_by_the_read_boundary_is_still_found(tmp_path: Path, monkeypatch) -> None:
    from launcher.backends import sourcedir

    write(tmp_path / "src" / "train.py")
    data = write(tmp_path / "src" / "data.bin")
    data.write_bytes(b"x" * ((1 << 20) - 5) + SECRET.encode())  # the value straddles the first 1 MiB
    with pytest.raises(sourcedir.SourceDirError, match="'data.bin' in the code holds the value of environment.T"):
        build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=tmp_path / "src",
                        include_packages=(), secrets={SECRET: "environment.T"})


CLOUD_CREDENTIALS = ["aws/credentials", "credentials", ".config/gcloud/application_default_credentials.json",
                     ".config/gcloud/credentials.db", ".config/gcloud/legacy_credentials/me/adc.json",
                     ".azure/msal_token_cache.json", ".cache/huggingface/token", ".boto", ".s3cfg", ".vault-token",
                     "putty.ppk"]


@pytest.mark.parametrize("name", CLOUD_CREDENTIALS)
def test_the_clouds_credential_files_are_left_out(tmp_path: Path, name: str) -> None:
    write(tmp_path / "src" / "train.py")
    write(tmp_path / "src" / name, "CREDENTIAL")
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=tmp_path / "src",
                             include_packages=())
    assert bundle.files == ["train.py"]
    assert bundle.excluded and name.startswith(bundle.excluded[0].rstrip("/"))


def test_a_link_is_judged_by_its_target(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "train.py")
    write(src / ".env", "HF_TOKEN=x")
    write(src / "real.cfg", "lr = 1")
    (src / "settings.cfg").symlink_to(".env")
    (src / "other.cfg").symlink_to("real.cfg")  # control: a link to an ordinary file ships
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="train.py", source_dir=src, include_packages=())
    assert bundle.files == ["other.cfg", "real.cfg", "train.py"]
    assert bundle.excluded == [".env", "settings.cfg"]
