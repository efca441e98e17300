"""A channel holds regular files and directories only (issue 31, item 7): a device, a FIFO or a link
to one is refused at `validate` and `submit`, naming the path, never copied (`/dev/zero` fills the
disk) nor read as an empty channel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.wire.opt_ml import write_opt_ml

JOB = """entry_point: train.py
instance_type: local
framework_version: "2.8.0"
py_version: py312
inputs: {{train: {train}}}
"""


def _job(tmp_path: Path, train: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "a"}\n')
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(train=train))
    return path


@pytest.mark.parametrize("command", [["validate"], ["submit", "--dry-run"]])
@pytest.mark.parametrize("case", ["link to a device in the directory", "device", "fifo"])
def test_special_files_in_a_channel_are_refused(tmp_path: Path, home: Path, command: list[str], case: str) -> None:
    if case == "link to a device in the directory":
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "zero.bin").symlink_to("/dev/zero")
        train, said = "data", f"{tmp_path}/data/zero.bin is a character device (through a link)"
    elif case == "device":
        train, said = "/dev/zero", "/dev/zero is a character device"
    else:
        os.mkfifo(tmp_path / "fifo")
        train, said = "fifo", f"{tmp_path}/fifo is a FIFO"
    result = CliRunner().invoke(main, [*command, str(_job(tmp_path, train))])
    assert result.exit_code == 2, result.output
    shown = str((tmp_path / train).resolve())  # a job file's paths are read relative to it (jobfile.PATH_FIELDS)
    assert f"inputs.train = \"{shown}\": {said}: a channel holds regular files and directories only" in result.output
    assert not home.exists()  # nothing written


def test_a_channel_of_regular_files_is_accepted(tmp_path: Path, home: Path) -> None:
    """Control: the same job with an ordinary data directory validates."""
    result = CliRunner().invoke(main, ["validate", str(_job(tmp_path, "data"))])
    assert result.exit_code == 0, result.output


def test_the_opt_ml_writer_refuses_a_device_that_appeared_after_validation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "zero.bin").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="zero.bin is a character device"):
        write_opt_ml(tmp_path / "host", hyperparameters={}, current_host="algo-1", hosts=["algo-1"],
                     instance_type="local", channels={"train": data})
    assert not (tmp_path / "host" / "input" / "data" / "train" / "zero.bin").exists()
