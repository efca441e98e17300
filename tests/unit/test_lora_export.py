"""What a LoRA job leaves in model.tar.gz (container/checkpoint/peft_export.py, issue 52 section 4):
the adapter in peft's format, which `PeftModel.from_pretrained(base, dir)` loads with our logits, named
as peft's own save_pretrained names it; with merge_weights the merged model under merged/, which
`AutoModelForCausalLM.from_pretrained` loads with our logits and whose weights are peft's
merge_and_unload's. Written in-process, at world 1."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from container.checkpoint.peft_export import ADAPTER_CONFIG, ADAPTER_WEIGHTS, MERGED, export_lora
from launcher.wire.training.lora import LoraSettings
from tests.support.close import assert_close, logits_terms
from tests.support.hf_models import SEQ
from tests.support.peft_reference import ALL_LINEAR, lora_model, ours_with_adapters, random_tokens, torchao_off

LORA = LoraSettings(r=8, alpha=16, dropout=0.0, targets=ALL_LINEAR, modules_to_save=("lm_head",), merge=True)


@pytest.fixture(scope="module")
def exported(lora_base, tmp_path_factory):
    """Our model with trained-looking adapters and head, exported; (spec, ours, base directory, model_dir)."""
    directory, spec = lora_base
    ours = ours_with_adapters(directory, spec, LORA)
    generator = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for parameter in (p for p in ours.parameters() if p.requires_grad):
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    out = tmp_path_factory.mktemp("model")
    export_lora(ours.eval(), spec, LORA, out, torch.float32, base="org/tiny")
    return spec, ours, directory, out


def _logits(model, spec):
    with torch.no_grad():
        out = model(random_tokens(spec.vocab_size))
    return out if isinstance(out, torch.Tensor) else out.logits


def test_peft_loads_the_adapter_with_our_logits(exported):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec, ours, directory, out = exported
    with torchao_off():
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(directory), out).eval()
    assert_close(_logits(loaded, spec), _logits(ours, spec), terms=logits_terms(spec, SEQ), what="logits")
    config = json.loads((out / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (8, 16, "org/tiny")
    base_only = AutoModelForCausalLM.from_pretrained(directory).eval()  # control: the adapter changes the logits
    with pytest.raises(AssertionError, match="off by more than"):
        assert_close(_logits(base_only, spec), _logits(ours, spec), terms=logits_terms(spec, SEQ))


def test_the_adapter_s_tensors_are_named_as_peft_writes_them(exported, tmp_path):
    from transformers import AutoModelForCausalLM

    _, _, directory, out = exported
    reference = lora_model(AutoModelForCausalLM.from_pretrained(directory), r=LORA.r, lora_alpha=LORA.alpha,
                           target_modules=list(LORA.targets), modules_to_save=list(LORA.modules_to_save))
    reference.save_pretrained(tmp_path)
    with safe_open(str(out / ADAPTER_WEIGHTS), "pt") as ours, safe_open(str(tmp_path / ADAPTER_WEIGHTS), "pt") as peft:
        assert sorted(ours.keys()) == sorted(peft.keys())
        assert all(ours.get_slice(k).get_shape() == peft.get_slice(k).get_shape() for k in peft.keys())  # noqa: SIM118


def test_the_merged_model_is_peft_s_merge_and_transformers_loads_it(exported):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec, ours, directory, out = exported
    merged = AutoModelForCausalLM.from_pretrained(out / MERGED).eval()
    terms = logits_terms(spec, SEQ) + LORA.r  # the merge adds B @ A's r products to each weight
    assert_close(_logits(merged, spec), _logits(ours, spec), terms=terms, what="merged logits")
    with torchao_off():
        reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(directory), out)
        reference = reference.merge_and_unload().state_dict()
    for name, tensor in merged.state_dict().items():
        assert_close(tensor, reference[name], terms=LORA.r + 1, what=name)
    assert not (out / MERGED / ADAPTER_CONFIG).exists()  # else transformers would take it for an adapter
