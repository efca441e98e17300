"""AWS's model_type hyperparameters against transformers, the reference: for each model_type the
model smlaunch builds from the script's size arguments has the weights and logits of the
transformers model AWS's script builds from the same arguments (train_utils.get_model_config,
mirrored by `aws_config` below), loaded both ways from one checkpoint; fp32, within the tolerance
of their sums added in other orders (tests/support/close.py, at the largest logit's scale). Its
config.json reads back as the same model, its export loads in transformers with the same logits,
its parameter count is transformers', and what the chosen model does not have is refused by
name. AWS's other arguments: tests/unit/test_aws_arguments.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from container.checkpoint.hf_export import export_hf, load_hf_weights
from container.models.llama import build_model
from launcher.config import TrainingHyperparameters
from launcher.wire.training import flops
from launcher.wire.training.hf_config import hf_config, spec_from_hf_config
from launcher.wire.training.model_resolution import resolve_model
from launcher.wire.training.models import ModelSpec
from tests.support.close import assert_close, logits_terms, order_tolerance

transformers = pytest.importorskip("transformers")
SEQ = 48  # longer than the windows below, so a sliding window changes the logits
SIZES = {"hidden_width": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 320, "max_context_width": 128}
MODEL_TYPES = {
    "llama_v3": {**SIZES, "num_key_value_heads": 2, "llama_intermediate_size": 176, "rope_scaling_type": "llama3",
                 "rope_scaling_original_max_position_embeddings": 32},
    "llama_v2": {**SIZES, "intermediate_size": 176, "rotary_emb_base": 20000},
    "mistral": {**SIZES, "num_key_value_heads": 2, "intermediate_size": 96, "sliding_window": 16},
    "mixtral": {**SIZES, "num_key_value_heads": 2, "intermediate_size": 96, "num_local_experts": 4,
                "num_experts_per_tok": 1, "router_aux_loss_coef": 0.02, "sliding_window": 24},
    "mixtral-top2": {**SIZES, "intermediate_size": 96, "num_local_experts": 4},
    "gpt_neox": {**SIZES},
    "gpt_neox-sequential": {**SIZES, "rotary_pct": 0.5, "intermediate_size": 96, "initializer_range": 0.01},
}


def aws_config(model_type: str, hp: dict):
    """The transformers config AWS's script builds for these arguments (its defaults where smlaunch
    takes them: docs/models.md; smlaunch honours an explicit rotary_emb_base for every type)."""
    common = {"vocab_size": hp["vocab_size"], "hidden_size": hp["hidden_width"], "num_hidden_layers": hp["num_layers"],
              "num_attention_heads": hp["num_heads"], "max_position_embeddings": hp["max_context_width"],
              "initializer_range": hp.get("initializer_range", 0.02), "tie_word_embeddings": False}
    if model_type == "gpt_neox":
        return transformers.GPTNeoXConfig(
            **common, hidden_act="gelu", intermediate_size=hp.get("intermediate_size", 4 * hp["hidden_width"]),
            rotary_pct=hp.get("rotary_pct", 0.25), rotary_emb_base=hp.get("rotary_emb_base", 10000),
            layer_norm_eps=1e-5, use_parallel_residual=hp.get("parallel", True), attention_dropout=0.0,
            hidden_dropout=0.0)
    common.update(intermediate_size=hp.get("intermediate_size", hp.get("llama_intermediate_size")),
                  num_key_value_heads=hp.get("num_key_value_heads", hp["num_heads"]), hidden_act="silu")
    if model_type in ("llama_v2", "llama_v3"):
        rope = {"rope_type": "default"}
        if hp.get("rope_scaling_type") == "llama3":
            rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": hp["rope_scaling_original_max_position_embeddings"]}
        theta = hp.get("rotary_emb_base", 500000.0 if model_type == "llama_v3" else 10000.0)
        return transformers.LlamaConfig(**common, rms_norm_eps=1e-5, rope_parameters={"rope_theta": theta, **rope})
    tokens = {"bos_token_id": 1, "eos_token_id": 2, "sliding_window": hp.get("sliding_window")}
    if model_type == "mistral":
        return transformers.MistralConfig(**common, **tokens, rms_norm_eps=1e-6,
                                          rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    return transformers.MixtralConfig(
        **common, **tokens, rms_norm_eps=1e-5, rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
        num_local_experts=hp["num_local_experts"], num_experts_per_tok=hp.get("num_experts_per_tok", 2),
        router_aux_loss_coef=hp.get("router_aux_loss_coef", 0.001), output_router_logits=False)


def resolve(hp: dict) -> ModelSpec:
    resolution = resolve_model(TrainingHyperparameters.model_validate(hp))
    assert resolution.issues == [], resolution.issues
    return resolution.spec


def case(name: str) -> tuple[str, dict]:
    model_type = name.split("-")[0]
    hp = dict(MODEL_TYPES[name])
    if name == "gpt_neox-sequential":  # GPT-NeoX's other residual form, from a config.json only
        hp["parallel"] = False
    return model_type, hp


@pytest.fixture(scope="module", params=list(MODEL_TYPES))
def built(request, tmp_path_factory):
    """(name, spec, transformers' model with random weights, its directory, smlaunch's model of it)."""
    model_type, hp = case(request.param)
    config = aws_config(model_type, hp)
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # larger than initializer_range, so every weight and bias shows in the logits
        for param in reference.parameters():
            param.normal_(std=0.1)
    directory = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(directory)
    spec = spec_from_hf_config(json.loads((directory / "config.json").read_text()), request.param)
    if "parallel" not in hp:  # the hyperparameters make the model the config.json describes
        ours = resolve({"model_type": model_type, **hp})
        if model_type.startswith("llama"):  # LlamaConfig's default tokens are Llama 2's; smlaunch sets none
            ours = replace(ours, bos_token_id=spec.bos_token_id, eos_token_id=spec.eos_token_id)
        assert replace(ours, name=spec.name) == spec
    ours = build_model(spec, SEQ)
    load_hf_weights(ours, directory)
    return request.param, spec, reference, directory, ours.eval()


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (3, SEQ), generator=torch.Generator().manual_seed(1))


def test_logits_equal_transformers(built):
    name, spec, reference, _, ours = built
    tokens = _tokens(spec.vocab_size)
    terms = logits_terms(spec, SEQ)
    with torch.no_grad():
        want = reference(tokens).logits
        assert_close(ours(tokens), want, terms=terms, what=f"{name}: logits")
        if spec.sliding_window:  # the control: without its window the model is another one
            whole = build_model(replace(spec, sliding_window=None), SEQ)
            whole.load_state_dict(ours.state_dict())
            off = (whole.eval()(tokens) - want).abs().max().item()
            assert off > 100 * order_tolerance(terms) * want.abs().max().item()


def test_parameter_counts_are_transformers(built):
    _, spec, reference, _, ours = built
    count = sum(p.numel() for p in reference.parameters())
    assert spec.parameter_count() == count == ours.num_params(exclude_embedding=False)
    # the FLOPs' matmul weights: every 2-D weight but the embedding's (a lookup); an MoE counts
    # the experts a token visits and the router
    matrices = sum(p.numel() for n, p in reference.named_parameters()
                   if p.dim() >= 2 and "embed_in" not in n and "embed_tokens" not in n)
    if spec.is_moe:
        per_expert = 3 * spec.hidden_size * spec.intermediate_size * spec.num_layers
        matrices -= (spec.num_experts - spec.experts_per_token) * per_expert
    assert flops.matmul_params(spec) == matrices


def test_the_export_is_the_model_transformers_loads(built, tmp_path):
    name, spec, reference, _, ours = built
    export_hf(ours, spec, tmp_path, dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == reference.config.model_type
    assert replace(spec_from_hf_config(config, spec.name), unsupported=()) == spec
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(reference)
    tokens = _tokens(spec.vocab_size)
    with torch.no_grad():
        assert_close(loaded(tokens).logits, reference(tokens).logits, terms=logits_terms(spec, SEQ),
                     what=f"{name}: logits of the export")
    if spec.is_moe:  # the routing the model trained with is the one it is exported with
        assert (loaded.config.num_experts_per_tok, loaded.config.router_aux_loss_coef) == (
            spec.experts_per_token, spec.router_aux_loss_coef)
    if spec.sliding_window:
        assert loaded.config.sliding_window == spec.sliding_window


def test_the_config_json_round_trips_for_every_architecture():
    for name in MODEL_TYPES:
        if name != "gpt_neox-sequential":
            spec = resolve({"model_type": name.split("-")[0], **MODEL_TYPES[name]})
            read = spec_from_hf_config(hf_config(spec), spec.name)
            if spec.bos_token_id is None:  # a Llama without tokens reads LlamaConfig's defaults back
                read = replace(read, bos_token_id=None, eos_token_id=None)
            assert read == spec


def test_gpt_neox_keeps_what_aws_script_fixes():
    spec = resolve({"model_type": "gpt_neox", **SIZES})
    assert (spec.intermediate_size, spec.rotary_pct, spec.rotary_dim, spec.hidden_act, spec.parallel_residual,
            spec.attention_bias, spec.tie_embeddings, spec.norm_eps, spec.rope_theta) == (
        256, 0.25, 4, "gelu", True, True, False, 1e-5, 10000.0)


def test_transformers_5_gpt_neox_config_reads_the_same(tmp_path):
    """transformers 5 writes rope_parameters (partial_rotary_factor, rope_theta) where 4.x wrote
    rotary_pct and rotary_emb_base; either reads as GPTNeoXConfig reads it."""
    config = aws_config("gpt_neox", {**SIZES, "rotary_pct": 0.5, "rotary_emb_base": 5000})
    config.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    spec = spec_from_hf_config(written, "m")
    assert (spec.rotary_pct, spec.rope_theta) == (0.5, 5000.0)
    v4 = {k: v for k, v in written.items() if k != "rope_parameters"} | {"rotary_pct": 0.5, "rotary_emb_base": 5000}
    assert spec_from_hf_config(v4, "m") == spec


def test_a_mistral_config_without_sliding_window_takes_mistral_default():
    config = hf_config(resolve({"model_type": "mistral", **MODEL_TYPES["mistral"]}))
    del config["sliding_window"]
    assert spec_from_hf_config(config, "m").sliding_window == transformers.MistralConfig().sliding_window == 4096
    assert spec_from_hf_config({**config, "sliding_window": None}, "m").sliding_window is None


def _errors(hp: dict) -> dict[str, str]:
    resolution = resolve_model(TrainingHyperparameters.model_validate(hp))
    return {issue.path.removeprefix("hyperparameters."): f"{issue.problem}; {issue.fix}"
            for issue in resolution.issues if issue.level == "error"}


@pytest.mark.parametrize("hp, key, words", [
    ({"model_type": "mixtral", **MODEL_TYPES["mixtral"], "num_experts_per_tok": 5}, "num_experts_per_tok",
     "5 experts per token is not a whole number from 1 to the model's 4 experts"),
    ({"model_type": "llama_v3", **MODEL_TYPES["llama_v3"], "num_experts_per_tok": 1}, "num_experts_per_tok",
     "applies to a mixture of experts"),
    ({"model_type": "llama_v3", **MODEL_TYPES["llama_v3"], "router_aux_loss_coef": 0.1}, "router_aux_loss_coef",
     "applies to a mixture of experts"),
    ({"model_type": "llama_v2", **MODEL_TYPES["llama_v2"], "sliding_window": 16}, "sliding_window",
     "sliding windows are Mistral's and Mixtral's"),
    ({"model_type": "gpt_neox", **SIZES, "sliding_window": 16}, "sliding_window",
     "sliding windows are Mistral's and Mixtral's"),
    ({"model_type": "mistral", **MODEL_TYPES["mistral"], "rotary_pct": 0.5}, "model_type",
     "rotary_pct, hidden_act, parallel_residual and attention_bias are GPT-NeoX's"),
    ({"model_type": "gpt_neox", **SIZES, "num_key_value_heads": 2}, "num_key_value_heads",
     "GPT-NeoX has one key and one value head per attention head"),
    ({"model_type": "gpt_neox", **SIZES, "num_local_experts": 4}, "num_local_experts", "GPT-NeoX has a dense MLP"),
    ({"model_type": "gpt_neox", **SIZES, "rope_scaling_type": "llama3"}, "rope_scaling_type",
     "GPT-NeoX's RoPE takes no Llama 3 frequency scaling"),
    ({"model_type": "gpt_neox", **SIZES, "rotary_pct": 0.1}, "rotary_pct", "RoPE needs an even number of them"),
    ({"model_type": "llama_v3", **MODEL_TYPES["llama_v2"], "rope_scaling_factor": 4.0}, "rope_scaling_factor",
     "scales RoPE only with rope_scaling_type: llama3"),
    ({"model_type": "mixtral", **MODEL_TYPES["mixtral"], "moe_load_balancing": "none"}, "router_aux_loss_coef",
     "moe_load_balancing: none leaves out"),
    ({"model_preset": "llama3-tiny", "model_type": "gpt_neox"}, "model_type",
     "builds a GPTNeoXConfig model, but model_preset names a llama model"),
])
def test_what_the_model_does_not_have_is_refused_by_name(hp, key, words):
    errors = _errors(hp)
    assert key in errors and words in errors[key], errors


def test_out_of_range_arguments_are_refused_before_any_model():
    for bad in ({"num_experts_per_tok": 0}, {"rotary_pct": 1.5}, {"sliding_window": 0}, {"router_aux_loss_coef": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainingHyperparameters.model_validate({"model_type": "mixtral", **bad})


def test_moe_arguments_reach_the_model():
    spec = resolve({"model_type": "mixtral", **MODEL_TYPES["mixtral"]})
    assert (spec.num_experts, spec.experts_per_token, spec.router_aux_loss_coef, spec.sliding_window) == (
        4, 1, 0.02, 24)
    model = build_model(spec, SEQ)
    assert model.layers["0"].moe.top_k == 1
    # AWS's defaults: 8 experts, 2 per token, MixtralConfig's 0.001; moe_load_balancing none: no loss
    default = resolve({"model_type": "mixtral", **SIZES, "intermediate_size": 96})
    assert (default.num_experts, default.experts_per_token, default.router_aux_loss_coef) == (8, 2, 0.001)
    unweighted = resolve({"model_type": "mixtral", **SIZES, "intermediate_size": 96, "moe_load_balancing": "none"})
    assert unweighted.router_aux_loss_coef == 0.0
    # next to a preset: the experts per token of the Mixtral preset
    assert resolve({"model_preset": "mixtral-tiny", "num_experts_per_tok": 1}).experts_per_token == 1


def test_planner_sizes_are_the_parameter_counts(tmp_path):
    from launcher.config import ModelParallelParameters
    from launcher.plan.terms import Sizes
    from launcher.wire.training.layout import ParallelLayout

    layout = ParallelLayout.from_parameters(ModelParallelParameters(), 1)
    for name in ("gpt_neox", "mistral", "mixtral"):
        spec = resolve({"model_type": name, **MODEL_TYPES[name]})
        sizes = Sizes.of(type("W", (), {"spec": spec, "layout": layout, "lora": None})())
        assert sizes.total == spec.parameter_count()
        assert sizes.block * spec.num_layers + sizes.root == sizes.total


def test_the_window_shortens_the_attention_flops():
    spec = resolve({"model_type": "mistral", **MODEL_TYPES["mistral"]})
    whole = replace(spec, sliding_window=None)
    per_layer_head = 12 * spec.num_layers * spec.num_heads * spec.head_dim
    assert flops.flops_per_token(whole, 64) - 6 * flops.matmul_params(whole) == per_layer_head * 32
    # 16 keys a token, but for the first 16 tokens: (16·17/2 + 48·16) / 64 ≈ 16 - 16²/128
    assert flops.flops_per_token(spec, 64) - 6 * flops.matmul_params(spec) == per_layer_head * (16 - 256 / 128)
    assert flops.flops_per_token(spec, 8) == flops.flops_per_token(whole, 8)


def test_validation_refuses_transformer_engine_fp8_for_gpt_neox():
    from launcher.config import ConfigError, validate_job
    from tests.support.model_rules import job

    hp = {"model_preset": None, "model_type": "gpt_neox", **SIZES, "max_context_width": 64, "bf16": 1, "fp8": 1,
          "fp8_emulate": 1, "fp8_backend": "transformer_engine"}
    with pytest.raises(ConfigError) as caught:
        validate_job(job(hp))
    (issue,) = [i for i in caught.value.issues if i.path == "hyperparameters.fp8_backend"]
    assert "GPT-NeoX's have biases" in issue.problem and "torchao" in issue.fix
    validate_job(job({**hp, "fp8_backend": "torchao", "fp8_recipe": "current"}))
