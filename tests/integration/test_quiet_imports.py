"""A user sees no noise that is not theirs. Importing torchao logs warnings on every import (its C++
and CUDA extensions built for another torch or Python, Triton missing; newer releases also torch's
pytree deprecation); the runtime holds them back while it imports torchao for FP8 (container.fp8),
and the project pins a torchao that transformers does not import with every model (pyproject.toml's
test extra), so a script that imports or loads a transformers model, a job's log and an artifact
loaded back say nothing of torchao. The control imports torchao directly."""

from __future__ import annotations

import subprocess
import sys

NOISE = ("WARNING:torchao", "Failed to load", "register_constant() on Enum subclasses is deprecated", "_pytree")
SETUP = "import logging; logging.basicConfig(level=logging.INFO)\n"


def _stderr(code: str, cwd=None) -> str:
    return subprocess.run([sys.executable, "-c", SETUP + code], capture_output=True, text=True, check=True,
                          timeout=120, cwd=cwd).stderr


def test_the_runtime_imports_torchao_quietly():
    stderr = _stderr("from container.fp8 import _torchao_float8\n"
                     "assert _torchao_float8().Float8LinearConfig\n"
                     "logging.getLogger('torchao').warning('after the import, torchao warns as before')")
    control = "WARNING:torchao:after the import, torchao warns as before\n"
    assert control in stderr  # the loggers' levels are restored
    assert not [n for n in NOISE if n in stderr.replace(control, "")], stderr


def test_a_plain_import_of_torchao_shows_the_noise():
    stderr = _stderr("import torchao.float8")
    assert "WARNING:torchao" in stderr, stderr


def test_a_transformers_model_imports_and_loads_without_torchao(tmp_path):
    """What a user's script does with the project's environment, and the notebook with an artifact."""
    stderr = _stderr("import sys\n"
                     "from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM\n"
                     "config = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, "
                     "intermediate_size=32, vocab_size=64)\n"
                     "LlamaForCausalLM(config).save_pretrained('model')\n"
                     "AutoModelForCausalLM.from_pretrained('model')\n"
                     "assert 'torchao' not in sys.modules, 'transformers imported torchao'\n", cwd=tmp_path)
    assert not [n for n in NOISE if n in stderr], stderr
