"""peft, LoRA's reference (issue 52), as the tests use it on plain CPU models.

peft 0.21 raises ImportError wherever it asks whether torchao quantized a layer and finds a torchao
older than 0.16; the test extra pins torchao 0.14.1 (pyproject.toml says why). The tests' bases are
plain tensors, so the question's answer is no: `torchao_off` says so while peft builds or loads."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock


@contextmanager
def torchao_off():
    with mock.patch("peft.tuners.lora.torchao.is_torchao_available", return_value=False), \
            mock.patch("peft.utils.quantization_utils.is_torchao_available", return_value=False):
        yield


def lora_model(model, **config):
    """peft.get_peft_model(model, LoraConfig(**config))."""
    from peft import LoraConfig, get_peft_model

    with torchao_off():
        return get_peft_model(model, LoraConfig(**config))
