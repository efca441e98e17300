"""What the tests of users' own scripts share (tests/{unit,integration}/test_own_scripts.py, the Slurm
e2e test): tiny wheels that need no index, a launching environment of the test's own, and a
snapshot of what an environment has installed.

The launching environment is a virtual environment in the test's directory that sees this one's
packages (torch, smlaunch) through a `.pth` file, as a user's environment would have them: a job
that wrongly installed its requirements into the Python that launched it would change that
environment, not the suite's, and the snapshot would show it.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

# pydantic 1.10.13 is what the script pinned; smlaunch needs pydantic >= 2.6.
PINNED = ("pydantic", "1.10.13")
PROBE = ("smlaunch_own_probe", "0.1")


def wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of `files` (what `pip wheel` of a pyproject.toml project would build)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as zf:
        for file, text in files.items():
            zf.writestr(file, text)
    return path


def wheels(directory: Path) -> Path:
    """A directory of two wheels: a package of its own (smlaunch_own_probe 0.1) and a pydantic
    1.10.13 that says who it is (smlaunch uses pydantic 2)."""
    wheel(directory, *PROBE, {f"{PROBE[0]}/__init__.py": "VALUE = 42\n"})
    wheel(directory, *PINNED, {"pydantic/__init__.py": f"VERSION = {PINNED[1]!r}\nFAKE = True\n"})
    return directory


def requirements(*lines: str) -> str:
    """A requirements.txt that installs from the code's `wheels/` only (no index is asked): a path
    outside source_dir is refused, as it would not exist on SageMaker (see `ship_wheels`)."""
    return "\n".join(["--no-index", "--find-links ./wheels", *lines]) + "\n"


def ship_wheels(code_dir: Path, wheel_dir: Path) -> None:
    """The wheels of `wheel_dir` in `code_dir/wheels`, where `requirements` finds them."""
    shutil.copytree(wheel_dir, code_dir / "wheels", dirs_exist_ok=True)


def launching_environment(directory: Path) -> Path:
    """The Python of a fresh venv that sees this interpreter's site directories (torch, smlaunch)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = directory / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    adds = "; ".join(f"site.addsitedir({d!r})" for d in site.getsitepackages())
    Path(purelib, "_suite_packages.pth").write_text(f"import site; {adds}\n")
    return python


SNAPSHOT = """
import json, os, sys, sysconfig
from importlib.metadata import distributions
dists = sorted((d.metadata["Name"], d.version, str(d._path)) for d in distributions())
files = []
for root in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
    for path, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files += sorted((os.path.relpath(os.path.join(path, n), root), os.path.getsize(os.path.join(path, n)))
                        for n in names if not n.endswith(".pyc"))
print(json.dumps({"prefix": sys.prefix, "distributions": dists, "files": files}))
"""


def installed(python: Path) -> dict:
    """What `python`'s environment has installed: every distribution it sees (name, version, where),
    and the files of its own site-packages."""
    out = subprocess.run([str(python), "-c", SNAPSHOT], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def own_wheels(tmp_path_factory) -> Path:
    return wheels(tmp_path_factory.mktemp("wheels"))


def submit(python: Path, job: Path, home: Path, *args: str, timeout: float = 300,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`smlaunch submit JOB ARGS` run by `python` (the launching environment), with its own SMLAUNCH_HOME
    (and `env`'s variables)."""
    from tests.support.local_jobs import cli_env
    from tests.support.train_runs import ROOT

    return subprocess.run([str(python), "-m", "launcher.cli", "submit", str(job), *args],
                          env=cli_env(home, **(env or {})), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def script_job(tmp_path: Path, text: str, reqs: str | None = None, *, name: str = "job", wheels: Path | None = None,
               **fields) -> Path:
    """A job file for a user script `job.py` (and requirements.txt, and the `wheels` it installs from)
    of its own source_dir: 2 local hosts."""
    src = tmp_path / f"{name}-src"
    src.mkdir()
    (src / "job.py").write_text(text)
    if reqs is not None:
        (src / "requirements.txt").write_text(reqs)
    if wheels is not None:
        ship_wheels(src, wheels)
    data = {"entry_point": "job.py", "source_dir": str(src), "instance_type": "local", "instance_count": 2,
            "distribution": {"torch_distributed": {"enabled": True}}, "base_job_name": name, **fields}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def job_name(proc: subprocess.CompletedProcess) -> str:
    """The job's name, from `submitted NAME (...)`."""
    return next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
