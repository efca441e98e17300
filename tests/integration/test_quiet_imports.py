"""A training job's log carries no noise that is not the user's: importing torchao (FP8) logs a
warning per CUDA extension built for another Python and torch's pytree deprecation, on every
import; the runtime holds both back (container.fp8). The control imports torchao directly."""

from __future__ import annotations

import subprocess
import sys

NOISE = ("Failed to load", "register_constant() on Enum subclasses is deprecated")
SETUP = "import logging; logging.basicConfig(level=logging.INFO)\n"


def _stderr(code: str) -> str:
    return subprocess.run([sys.executable, "-c", SETUP + code], capture_output=True, text=True, check=True,
                          timeout=120).stderr


def test_the_runtime_imports_torchao_quietly():
    stderr = _stderr("from container.fp8 import _torchao_float8\n"
                     "assert _torchao_float8().Float8LinearConfig\n"
                     "logging.getLogger('torchao').warning('after the import, torchao warns as before')")
    assert not [n for n in NOISE if n in stderr], stderr
    assert "after the import, torchao warns as before" in stderr  # the loggers' levels are restored


def test_a_plain_import_of_torchao_shows_the_noise():
    stderr = _stderr("import torchao.float8")
    assert all(n in stderr for n in NOISE), stderr
