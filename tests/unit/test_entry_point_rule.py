"""One rule for an entry_point outside source_dir (issue 31, item 15): `validate`, `submit --dry-run`
and the estimator refuse what `submit` refuses, before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.config import validate_job
from launcher.wire.training.issues import ConfigError

JOB = 'entry_point: {entry}\nsource_dir: src\ninstance_type: local\nframework_version: "2.8.0"\npy_version: py312\n'


@pytest.mark.parametrize("command", [["validate"], ["submit", "--dry-run"]])
@pytest.mark.parametrize("entry,ok", [("../outside.py", False), ("/abs/train.py", False),
                                      ("sub/../../outside.py", False), ("train.py", True)])
def test_an_entry_point_outside_source_dir_is_refused_everywhere(tmp_path: Path, home: Path, command, entry, ok):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print(1)\n")
    (tmp_path / "outside.py").write_text("print(1)\n")
    (tmp_path / "job.yaml").write_text(JOB.format(entry=entry))
    result = CliRunner().invoke(main, [*command, str(tmp_path / "job.yaml")])
    if ok:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2, result.output
    assert f'entry_point = "{entry}": must be a path inside source_dir' in result.output


def test_the_estimators_job_gets_the_same_rule(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(ConfigError, match="must be a path inside source_dir"):
        validate_job({"entry_point": "../outside.py", "source_dir": str(tmp_path / "src"), "instance_type": "local",
                      "framework_version": "2.8.0", "py_version": "py312"})
