"""What requirements.txt makes pip read from local paths (launcher/config/requirement_paths.py):
inside source_dir it is in the job's code on every target and keys the job's environment
(tests/unit/test_job_env.py); outside it (absolute, or `..`) it does not exist where pip runs on
SageMaker (/opt/ml/code), so validate refuses it, naming the line and the fix."""

from __future__ import annotations

import pytest

from launcher.config import ConfigError, validate_job
from launcher.config.requirement_paths import local_paths
from tests.support.sourcedir import write

INSIDE = ["numpy>=1.24  # an index's: no path", "-e ./pkg", "--find-links ./wheels", "-r reqs/more.txt",
          "./pkg[extra]", "ownpkg @ https://example.com/ownpkg-0.1.whl", "git+https://github.com/o/r#egg=r"]


def code(tmp_path, *lines: str):
    src = tmp_path / "src"
    write(src / "train.py", "print(1)\n")
    write(src / "pkg" / "pyproject.toml", "")
    write(src / "wheels" / "a-0.1-py3-none-any.whl", "")
    write(src / "reqs" / "more.txt", "-c ../constraints.txt\n")
    write(src / "constraints.txt", "numpy<3\n")
    write(src / "requirements.txt", "\n".join(lines) + "\n")
    return src


def job(src) -> dict:
    return {"entry_point": "train.py", "source_dir": str(src), "instance_type": "local"}


def test_every_local_path_pip_reads_is_found_with_its_line(tmp_path):
    src = code(tmp_path, *INSIDE, "-f/abs/wheels", "--requirement=../up.txt", "x @ file:///abs/x.whl",
               f"{tmp_path}/src/wheels/a-0.1-py3-none-any.whl", "--extra-index-url file:///abs/index \\",
               "  --pre")
    found = [(p.where, p.written, p.within, p.inside) for p in local_paths(src)]
    assert found == [
        ("requirements.txt:2", "./pkg", "pkg", True),
        ("requirements.txt:3", "./wheels", "wheels", True),
        ("requirements.txt:4", "reqs/more.txt", "reqs/more.txt", True),
        ("requirements.txt:5", "./pkg[extra]", "pkg", True),
        ("requirements.txt:8", "/abs/wheels", None, False),
        ("requirements.txt:9", "../up.txt", None, False),
        ("requirements.txt:10", "file:///abs/x.whl", None, False),
        ("requirements.txt:11", f"{tmp_path}/src/wheels/a-0.1-py3-none-any.whl", "wheels/a-0.1-py3-none-any.whl",
         False),  # in source_dir here, but by a path that exists on no other machine
        ("requirements.txt:12", "file:///abs/index", None, False),
        ("reqs/more.txt:1", "../constraints.txt", "constraints.txt", True),  # relative to the file naming it
    ]


def test_validate_refuses_paths_outside_source_dir_naming_line_and_fix(tmp_path):
    validate_job(job(code(tmp_path, *INSIDE)), base_dir=tmp_path)  # the control: all in the code
    src = code(tmp_path, *INSIDE, "../shared/ownpkg-0.1-py3-none-any.whl", "-r /etc/reqs.txt")
    with pytest.raises(ConfigError) as err:
        validate_job(job(src), base_dir=tmp_path)
    fix = ("copy it into source_dir and name it relative to it (e.g. ./wheels/, -e ./pkg), or install it from a "
           "package index")
    # fields, not str(issue): the value printed is cut at 80 characters, as a tmp_path may be
    assert [(i.path, i.value, i.problem, i.fix) for i in err.value.issues] == [
        ("source_dir", str(src), "requirements.txt:8: '../shared/ownpkg-0.1-py3-none-any.whl' is outside "
         "source_dir; pip runs in the job's copy of source_dir (as the SageMaker toolkit does, in /opt/ml/code), "
         "where only source_dir's files exist, relative to it", fix),
        ("source_dir", str(src), "requirements.txt:9: '/etc/reqs.txt' is outside source_dir; pip runs in the "
         "job's copy of source_dir (as the SageMaker toolkit does, in /opt/ml/code), where only source_dir's "
         "files exist, relative to it", fix),
    ]


def test_an_absolute_path_into_source_dir_is_told_its_relative_name(tmp_path):
    src = code(tmp_path, f"-e {tmp_path}/src/pkg")
    with pytest.raises(ConfigError) as err:
        validate_job(job(src), base_dir=tmp_path)
    assert [i.fix for i in err.value.issues] == ["write it relative to source_dir: ./pkg"]
