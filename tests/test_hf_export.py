"""Hugging Face export and import: transformers loads our export and computes our logits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from container.checkpoint.hf_export import export_hf, from_hf_name, load_hf_weights, to_hf_name
from container.models.llama import TransformerArgs, build_model, rope_inv_freq
from launcher.config.models import PRESETS
from tests.support.gloo import spawn

# Original context 64 with head_dim 16: one frequency is smoothed, six are divided by 8.
SCALED = replace(
    PRESETS["llama3-tiny"], rope_scaling=(8.0, 1.0, 4.0, 64), max_position_embeddings=256
)
SEQ = 128


def _model(spec, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(spec, SEQ)
    model.init_weights()
    return model


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


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


def _sharded(spec, seed: int):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model(spec, seed)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _fsdp_export_and_load(root: str) -> None:
    root = Path(root)
    for tied in (False, True):
        spec = replace(SCALED, tie_embeddings=tied)
        out = root / f"fsdp-{tied}"
        export_hf(_sharded(spec, seed=0), spec, out, dtype=torch.float32)

        # Rank 0 reads and broadcasts, or every rank reads the files itself.
        for distributed in (True, False):
            fresh = _sharded(spec, seed=1)
            load_hf_weights(fresh, root / f"plain-{tied}", distributed=distributed)
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            full = get_model_state_dict(fresh, options=options)
            if dist.get_rank() == 0:
                want = torch.load(root / f"plain-{tied}.pt")
                assert full.keys() == want.keys()
                assert all(torch.equal(full[k], want[k]) for k in want)

    # Rank 0 alone reads the files, yet every rank must raise rather than hang.
    with pytest.raises(ValueError, match="missing keys"):
        deeper = _sharded(replace(SCALED, num_layers=3), seed=0)
        load_hf_weights(deeper, root / "plain-False", distributed=True)


def test_fsdp_export_equals_unsharded_export(tmp_path):
    for tied in (False, True):
        spec = replace(SCALED, tie_embeddings=tied)
        model = _model(spec, seed=0)
        export_hf(model, spec, tmp_path / f"plain-{tied}", dtype=torch.float32)
        torch.save(model.state_dict(), tmp_path / f"plain-{tied}.pt")
    spawn(2, _fsdp_export_and_load, str(tmp_path))
    for tied in (False, True):
        plain, fsdp = tmp_path / f"plain-{tied}", tmp_path / f"fsdp-{tied}"
        assert (plain / "config.json").read_text() == (fsdp / "config.json").read_text()
        want, got = _tensors(plain), _tensors(fsdp)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
