"""What the unit and integration tests of sourcedir share (tests/{unit,integration}/test_sourcedir.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


def write(path: Path, text: str = "x", mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write(src / "train.py", "print('train')")
    write(src / "run.sh", "#!/bin/sh\n", mode=0o700)
    write(src / "lib" / "model.py")
    write(src / "lib" / "deep" / "layer.py")
    write(src / "data" / "vocab.txt")
    # everything below must be left out by DEFAULT_IGNORE
    write(src / ".git" / "config")
    write(src / "lib" / ".git" / "HEAD")
    write(src / ".venv" / "bin" / "python")
    write(src / "lib" / "deep" / ".venv" / "pyvenv.cfg")
    write(src / "venv" / "lib" / "x.py")
    write(src / "__pycache__" / "train.cpython-311.pyc")
    write(src / "lib" / "__pycache__" / "model.cpython-311.pyc")
    write(src / "lib" / "stale.pyc")
    write(src / ".env", "SECRET=1")
    write(src / "key.pem")
    write(src / "lib" / ".DS_Store")
    write(src / ".pytest_cache" / "v" / "cache")
    write(src / ".mypy_cache" / "3.11" / "x.json")
    write(src / "node_modules" / "left-pad" / "index.js")
    write(src / "notebooks" / ".ipynb_checkpoints" / "a.ipynb")
    return src


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable package outside the project, standing in for ``container``."""
    site = tmp_path / "site"
    write(site / "smlaunch_fakepkg" / "__init__.py", "VALUE = 'installed'\n")
    write(site / "smlaunch_fakepkg" / "sub" / "__init__.py")
    write(site / "smlaunch_fakepkg" / "__pycache__" / "__init__.cpython-311.pyc")
    monkeypatch.syspath_prepend(str(site))
    return "smlaunch_fakepkg"


# --- the runtime's requirements.txt -------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
