"""Mixtral against transformers, the reference: a tiny MixtralForCausalLM saved into a real
Hugging Face cache loads by name into smlaunch's model with the same logits, its auxiliary loss
and gradients are Hugging Face's, and the export is a Mixtral checkpoint transformers loads back."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from container.checkpoint import pretrained
from container.checkpoint.hf_export import export_hf, load_hf_weights
from container.models.llama import build_model
from container.models.moe import load_balancing_sum
from launcher.config import TrainingHyperparameters
from launcher.wire.training.hf_config import spec_from_hf_config
from tests.support.close import assert_close, llama_terms
from tests.support.hf_models import SEQ, hub_cache, mixtral_config, save_mixtral

transformers = pytest.importorskip("transformers")
REPO = "org/tiny-mixtral"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """org/tiny-mixtral in a huggingface_hub cache, and transformers' model of it."""
    root = tmp_path_factory.mktemp("mixtral")
    reference = save_mixtral(root / "files", mixtral_config())
    hub_cache(root / "hub", REPO, root / "files")
    return root / "hub", reference


@pytest.fixture
def ours(hub, monkeypatch):
    """smlaunch's model of org/tiny-mixtral, loaded through the pretrained path, offline."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(hub[0]))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub[0]))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hp = TrainingHyperparameters.model_validate({"hf_pretrained_model_name_or_dir": REPO})
    sources = pretrained.prepare(hp, 0, 0, 1)
    spec = pretrained.model_spec(hp, sources)
    model = build_model(spec, SEQ)
    load_hf_weights(model, sources.model.directory)
    return model, spec


def _tokens(vocab: int, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, SEQ), generator=torch.Generator().manual_seed(3))


def test_config_is_read_as_transformers_reads_it(hub, ours):
    config = hub[1].config
    spec = ours[1]
    assert (spec.num_experts, spec.experts_per_token, spec.router_aux_loss_coef, spec.rope_theta, spec.norm_eps) == (
        config.num_local_experts, config.num_experts_per_tok, config.router_aux_loss_coef,
        config.rope_parameters["rope_theta"], config.rms_norm_eps)
    assert spec.unsupported == ()


def test_absent_mixtral_keys_take_mixtral_defaults(tmp_path):
    minimal = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "intermediate_size": 96, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(minimal))
    ref = transformers.AutoConfig.from_pretrained(tmp_path)
    spec = spec_from_hf_config(minimal, "m")
    assert (spec.rope_theta, spec.norm_eps, spec.max_position_embeddings, spec.num_experts, spec.experts_per_token,
            spec.router_aux_loss_coef, spec.bos_token_id, spec.eos_token_id) == (
        ref.rope_parameters["rope_theta"], ref.rms_norm_eps, ref.max_position_embeddings, ref.num_local_experts,
        ref.num_experts_per_tok, ref.router_aux_loss_coef, ref.bos_token_id, ref.eos_token_id)


def test_what_the_runtime_lacks_is_listed():
    config = {**mixtral_config().to_dict(), "router_jitter_noise": 0.1}
    assert "router_jitter_noise: 0.1" in spec_from_hf_config(config, "m").unsupported
    # Mixtral's sliding window is the runtime's too (tests/unit/test_model_types.py)
    windowed = spec_from_hf_config({**mixtral_config().to_dict(), "sliding_window": 128}, "m")
    assert (windowed.sliding_window, windowed.unsupported) == (128, ())


def test_logits_equal_transformers(hub, ours):
    model, spec = ours
    tokens = _tokens(spec.vocab_size)
    with torch.no_grad():
        ref = hub[1](tokens).logits
        diff = (model.eval()(tokens) - ref).abs().max().item()
    assert diff <= 1e-5 * ref.abs().max().item(), diff


def test_routing_matters(hub, ours):
    """The differential test would catch top-1 routing or unnormalised top-k weights."""
    model, spec = ours
    tokens = _tokens(spec.vocab_size)
    with torch.no_grad():
        ref = hub[1](tokens).logits
        for layer in model.layers.values():
            layer.moe.top_k = 1
        assert (model(tokens) - ref).abs().max().item() > 1e-3


def test_aux_loss_and_gradients_equal_transformers_per_sequence(hub, ours):
    """For one sequence, loss = mean token loss + coef x aux is MixtralForCausalLM's (labels and
    output_router_logits), and so are the gradients of every weight (the router's included: the aux
    term is about a fifth of this router's gradient, far above the tolerance)."""
    model, spec = ours
    reference = hub[1]
    tokens = _tokens(spec.vocab_size, batch=1)
    out = reference(tokens, labels=tokens, output_router_logits=True)
    out.loss.backward()
    logits = model(tokens)
    token_loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    aux = load_balancing_sum(model)
    # Each tensor at its whole scale (all experts together: one that no token chose has a zero
    # gradient in both models, which a per-element relative error would divide by).
    terms = llama_terms(spec, SEQ, tokens.numel())
    assert_close(aux, out.aux_loss, terms=terms, what="aux loss")
    (token_loss + spec.router_aux_loss_coef * aux).backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    for i, layer in model.layers.items():
        ref_gate = ref_grads[f"model.layers.{i}.mlp.gate.weight"]
        assert_close(layer.moe.gate.weight.grad, ref_gate, terms=terms, what=f"layer {i} gate")
        w1, w3 = ref_grads[f"model.layers.{i}.mlp.experts.gate_up_proj"].chunk(2, dim=1)
        assert_close(layer.moe.experts.w1.grad, w1, terms=terms, what=f"layer {i} w1")
        assert_close(layer.moe.experts.w3.grad, w3, terms=terms, what=f"layer {i} w3")
        assert_close(layer.moe.experts.w2.grad, ref_grads[f"model.layers.{i}.mlp.experts.down_proj"], terms=terms,
                     what=f"layer {i} w2")


def test_aux_loss_is_the_sum_of_each_sequences(hub, ours):
    model, spec = ours
    tokens = _tokens(spec.vocab_size, batch=3)
    with torch.no_grad():
        model(tokens)
        ours_sum = load_balancing_sum(model).item()
        each = [hub[1](tokens[b:b + 1], output_router_logits=True).aux_loss.item() for b in range(3)]
        whole_batch = hub[1](tokens, output_router_logits=True).aux_loss.item()
    assert ours_sum == pytest.approx(sum(each), rel=1e-6)
    assert whole_batch != pytest.approx(sum(each) / 3, rel=1e-4)  # HF's batch-wide value is another number
    with pytest.raises(RuntimeError, match="forward first"):
        load_balancing_sum(model)  # taken


def test_export_is_a_mixtral_checkpoint_transformers_loads(tmp_path, ours):
    model, spec = ours
    export_hf(model, spec, tmp_path, dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("mixtral", ["MixtralForCausalLM"])
    assert replace(spec_from_hf_config(config, spec.name), unsupported=()) == spec
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.1.block_sparse_moe.gate.weight" in names
    assert {f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight" for e in range(4) for w in ("w1", "w2", "w3")} \
        <= names
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded).__name__ == "MixtralForCausalLM"
    tokens = _tokens(spec.vocab_size)
    with torch.no_grad():
        assert (loaded(tokens).logits - model.eval()(tokens)).abs().max().item() <= 1e-5


def test_missing_expert_is_named(tmp_path, ours):
    model, spec = ours
    export_hf(model, spec, tmp_path, dtype=torch.float32)
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing keys: model\.layers\.1\.block_sparse_moe\.experts\.3\.w2\.weight"):
        load_hf_weights(build_model(spec, SEQ), tmp_path)
