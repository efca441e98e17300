"""peft, LoRA's reference (issue 52), as the tests use it on plain CPU models, and the tiny Llama both
sides load (`lora_base`, a module-scoped fixture; `ours_with_adapters`: our model as the runtime
builds it).

peft 0.21 raises ImportError wherever it asks whether torchao quantized a layer and finds a torchao
older than 0.16; the test extra pins torchao 0.14.1 (pyproject.toml says why). The tests' bases are
plain tensors, so the question's answer is no: `torchao_off` says so while peft builds or loads."""

from __future__ import annotations

import json
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from tests.support.hf_models import SEQ, llama_config, save_llama

# every linear layer of a Llama block, by Hugging Face's names (what all-linear targets)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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


@pytest.fixture(scope="module")
def lora_base(tmp_path_factory):
    """A tiny Llama saved as transformers saves it: (its directory, its ModelSpec)."""
    from launcher.wire.training.hf_config import spec_from_hf_config

    directory = tmp_path_factory.mktemp("base")
    save_llama(directory, llama_config())
    return directory, spec_from_hf_config(json.loads((directory / "config.json").read_text()), "tiny")


def ours_with_adapters(directory, spec, lora):
    """Our model as the runtime builds it: adapters on, then the base's weights loaded around them."""
    from container.checkpoint.hf_export import load_hf_weights
    from container.models.llama import build_model
    from container.models.lora import adapter_names, apply_lora

    model = build_model(spec, SEQ)
    apply_lora(model, lora, seed=0)
    load_hf_weights(model, directory, exclude=adapter_names(model))
    return model


def random_tokens(vocab: int, batch: int = 2, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, SEQ), generator=torch.Generator().manual_seed(seed))
