"""Hugging Face export and import: transformers loads our export and computes our logits.
Here the tests that run in one process; those that start processes are tests/integration/test_hf_export.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from container.checkpoint.hf_export import export_hf, from_hf_name, load_hf_weights, to_hf_name
from container.models.llama import TransformerArgs, rope_inv_freq
from launcher.wire.training.models import PRESETS
from tests.support.hf_export import SCALED, SEQ, _model, _tensors


def test_rope_scaling_of_the_test_spec_changes_frequencies():
    scaled = rope_inv_freq(TransformerArgs.from_spec(SCALED, SEQ))
    plain = rope_inv_freq(TransformerArgs.from_spec(replace(SCALED, rope_scaling=None), SEQ))
    changed = (scaled != plain).sum().item()
    assert 0 < changed < len(plain)


def test_names_round_trip():
    names = _model(PRESETS["llama3-tiny"]).state_dict()
    hf = {to_hf_name(n) for n in names}
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.1.post_attention_layernorm.weight"} <= hf
    assert {from_hf_name(n) for n in hf} == set(names)
    assert from_hf_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_transformers_loads_export_and_matches_logits(tmp_path, tied):
    transformers = pytest.importorskip("transformers")
    spec = replace(SCALED, tie_embeddings=tied)
    model = _model(spec)
    export_hf(model, spec, tmp_path, dtype=torch.float32)

    assert ("lm_head.weight" in _tensors(tmp_path)) is not tied
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["torch_dtype"] == "float32" and config["rope_scaling"]["rope_type"] == "llama3"
    hf, info = transformers.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    tokens = torch.randint(0, spec.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert (ours - theirs).abs().max().item() <= 1e-4


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_sharded_export_round_trips(tmp_path, tied):
    spec = replace(SCALED, tie_embeddings=tied)
    model = _model(spec)
    export_hf(model, spec, tmp_path, dtype=torch.float32, max_shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    assert not (tmp_path / "model.safetensors").exists()

    fresh = _model(spec, seed=1)
    load_hf_weights(fresh, tmp_path)
    want = model.state_dict()
    got = fresh.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    if tied:
        assert fresh.output.weight is fresh.tok_embeddings.weight


def test_bfloat16_export_loads_into_an_fp32_model(tmp_path):
    spec = PRESETS["llama3-tiny"]
    model = _model(spec)
    export_hf(model, spec, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in _tensors(tmp_path).values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "generation_config.json").read_text())
    fresh = _model(spec, seed=1)
    load_hf_weights(fresh, tmp_path)
    for name, tensor in model.state_dict().items():
        assert fresh.state_dict()[name].dtype == torch.float32
        assert torch.equal(fresh.state_dict()[name], tensor.to(torch.bfloat16).float()), name


def test_load_names_every_mismatch(tmp_path):
    spec = PRESETS["llama3-tiny"]
    export_hf(_model(spec), spec, tmp_path)
    other = _model(replace(spec, num_layers=3, vocab_size=512))
    with pytest.raises(ValueError) as excinfo:
        load_hf_weights(other, tmp_path)
    message = str(excinfo.value)
    assert "missing keys: model.layers.2.self_attn.q_proj.weight" in message
    assert "model.embed_tokens.weight: file (256, 64), model (512, 64)" in message
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_weights(other, tmp_path / "absent")


