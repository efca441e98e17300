"""Pretrained Hugging Face models against transformers, the reference: configs as transformers 4
and 5 write them, weights in every save format, the Hub cache, and every way loading can fail."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from container.checkpoint import pretrained
from container.checkpoint.hf_export import export_hf, load_hf_weights
from container.models.llama import build_model
from launcher.config import TrainingHyperparameters
from launcher.wire.training.hf_config import generation_config, hf_config, spec_from_hf_config
from tests.support.hf_models import (
    COMMIT,
    LLAMA3_ROPE,
    SEQ,
    hub_cache,
    llama_config,
    save_llama,
    save_tokenizer,
)

transformers = pytest.importorskip("transformers")

VARIANTS = {  # (config kwargs, save kwargs)
    "llama3.1-v5-safetensors": ({}, {}),
    "llama3.1-v4-config": ({}, {"config_style": "v4"}),
    "llama3.2-tied-v4": ({"tied": True}, {"config_style": "v4"}),
    "default-rope-v5": ({"rope": None}, {}),
    "safetensors-sharded": ({}, {"shards": 3}),
    "bin-single": ({}, {"weights": "bin"}),
    "bin-sharded-tied": ({"tied": True}, {"weights": "bin", "shards": 3}),
    "head-dim-32": ({"head_dim": 32}, {}),
}


def _hp(**values) -> TrainingHyperparameters:
    return TrainingHyperparameters.model_validate(values)


def _ours(directory, hp=None):
    hp = hp or _hp(hf_pretrained_model_name_or_dir=str(directory))
    sources = pretrained.prepare(hp, 0, 0, 1)
    spec = pretrained.model_spec(hp, sources)
    model = build_model(spec, SEQ)
    load_hf_weights(model, sources.model.directory)
    return model.eval(), spec


def _tokens(vocab: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, SEQ), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_transformers(tmp_path, variant):
    config_kwargs, save_kwargs = VARIANTS[variant]
    save_llama(tmp_path / "m", llama_config(**config_kwargs), **save_kwargs)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()  # as users load it
    ours, _ = _ours(tmp_path / "m")
    tokens = _tokens(ours.args.vocab_size)
    with torch.no_grad():
        diff = (ours(tokens) - reference(tokens).logits).abs().max().item()
    assert diff <= 1e-5, diff


def test_rope_scaling_and_theta_matter(tmp_path):
    """The differential test would catch a dropped rope_scaling or a default rope_theta."""
    save_llama(tmp_path / "m", llama_config(), config_style="v4")
    ours, spec = _ours(tmp_path / "m")
    tokens = _tokens(spec.vocab_size)
    for wrong in (replace(spec, rope_scaling=None), replace(spec, rope_theta=10_000.0)):
        other = build_model(wrong, SEQ)
        other.load_state_dict(ours.state_dict())
        with torch.no_grad():
            assert (other(tokens) - ours(tokens)).abs().max().item() > 1e-3


@pytest.mark.parametrize("style", ["v4", "v5"])
@pytest.mark.parametrize("rope", ["llama3", "default"])
def test_config_fields_equal_transformers(tmp_path, style, rope):
    config = llama_config(rope=LLAMA3_ROPE if rope == "llama3" else None, tied=True, head_dim=32,
                          eos_token_id=[2, 3], pad_token_id=0)
    save_llama(tmp_path, config, config_style=style)
    ref = transformers.AutoConfig.from_pretrained(tmp_path)
    spec = spec_from_hf_config(json.loads((tmp_path / "config.json").read_text()), "m")
    assert spec.rope_theta == ref.rope_parameters["rope_theta"] == 500000.0
    if rope == "llama3":
        params = ref.rope_parameters
        assert spec.rope_scaling == (params["factor"], params["low_freq_factor"], params["high_freq_factor"],
                                     params["original_max_position_embeddings"])
    else:
        assert spec.rope_scaling is None and ref.rope_parameters["rope_type"] == "default"
    assert (spec.head_dim, spec.norm_eps, spec.max_position_embeddings, spec.tie_embeddings) == (
        ref.head_dim, ref.rms_norm_eps, ref.max_position_embeddings, ref.tie_word_embeddings)
    assert (spec.bos_token_id, list(spec.eos_token_id), spec.pad_token_id) == (
        ref.bos_token_id, ref.eos_token_id, ref.pad_token_id)
    assert spec.unsupported == ()


def test_absent_keys_take_transformers_defaults(tmp_path):
    minimal = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "intermediate_size": 176, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(minimal))
    ref = transformers.AutoConfig.from_pretrained(tmp_path)
    spec = spec_from_hf_config(minimal, "m")
    assert (spec.rope_theta, spec.norm_eps, spec.max_position_embeddings, spec.num_kv_heads, spec.tie_embeddings,
            spec.bos_token_id, spec.eos_token_id) == (
        ref.rope_parameters["rope_theta"], ref.rms_norm_eps, ref.max_position_embeddings, ref.num_key_value_heads,
        ref.tie_word_embeddings, ref.bos_token_id, ref.eos_token_id)


@pytest.mark.parametrize("tied", [False, True])
def test_export_round_trips_the_config(tmp_path, tied):
    save_llama(tmp_path / "m", llama_config(tied=tied, eos_token_id=[2, 3], head_dim=32), config_style="v4")
    model, spec = _ours(tmp_path / "m")
    export_hf(model, spec, tmp_path / "out", dtype=torch.float32)
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert replace(spec_from_hf_config(out, spec.name), unsupported=()) == spec
    source = transformers.AutoConfig.from_pretrained(tmp_path / "m").to_dict()
    exported = transformers.AutoConfig.from_pretrained(tmp_path / "out").to_dict()
    for key in ("rope_parameters", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id", "num_key_value_heads", "vocab_size"):
        assert exported[key] == source[key], key
    generation = transformers.GenerationConfig.from_pretrained(tmp_path / "out")
    assert (generation.bos_token_id, generation.eos_token_id) == (1, [2, 3])
    assert generation_config(spec) == {"bos_token_id": 1, "eos_token_id": [2, 3]}
    assert hf_config(spec)["rope_theta"] == 500000.0


@pytest.mark.parametrize("key, value, named", [
    ("attention_bias", True, "attention_bias: true"),
    ("mlp_bias", True, "mlp_bias: true"),
    ("hidden_act", "gelu", "hidden_act: gelu"),
    ("model_type", "qwen2", "model_type: qwen2"),
    ("attention_dropout", 0.1, "attention_dropout: 0.1"),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_type: linear"),
])
def test_what_the_runtime_lacks_is_refused_by_name(tmp_path, key, value, named):
    save_llama(tmp_path, llama_config(), config_style="v4")
    config = json.loads((tmp_path / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    hp = _hp(hf_pretrained_model_name_or_dir=str(tmp_path))
    with pytest.raises(pretrained.PretrainedError, match=named):
        pretrained.model_spec(hp, pretrained.prepare(hp, 0, 0, 1))


def test_missing_and_unexpected_weights_are_named(tmp_path):
    save_llama(tmp_path, llama_config(), weights="bin")
    state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    state.pop("model.layers.1.mlp.up_proj.weight")
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"missing keys: model\.layers\.1\.mlp\.up_proj\.weight; "
                                         r"unexpected keys: model\.layers\.0\.self_attn\.q_proj\.bias"):
        _ours(tmp_path)


def test_a_bin_holding_code_is_refused(tmp_path):
    """weights_only: a pickle that would run code on load is not executed."""
    save_llama(tmp_path, llama_config(), weights="bin")
    torch.save({"model.embed_tokens.weight": torch.zeros(1), "evil": print}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights only|unsupported global|weights_only"):
        _ours(tmp_path)


def test_a_directory_without_weights_is_refused(tmp_path):
    save_llama(tmp_path, llama_config())
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="holds no weights .*init_from_scratch"):
        _ours(tmp_path)


def test_init_from_scratch_takes_only_the_architecture(tmp_path):
    save_llama(tmp_path, llama_config())
    hp = _hp(hf_pretrained_model_name_or_dir=str(tmp_path), init_from_scratch=True)
    sources = pretrained.prepare(hp, 0, 0, 1)
    assert not sources.load_weights and pretrained.model_spec(hp, sources).rope_scaling == (8.0, 1.0, 4.0, 64)


def test_size_hyperparameters_must_agree_with_pretrained_weights(tmp_path):
    save_llama(tmp_path, llama_config())
    ok = _hp(hf_pretrained_model_name_or_dir=str(tmp_path), vocab_size=320, model_type="llama_v3")
    assert pretrained.model_spec(ok, pretrained.prepare(ok, 0, 0, 1)).vocab_size == 320
    bad = _hp(hf_pretrained_model_name_or_dir=str(tmp_path), vocab_size=128256)
    with pytest.raises(pretrained.PretrainedError, match=r"vocab_size = 128256: differs from .* \(.*320\)"):
        pretrained.model_spec(bad, pretrained.prepare(bad, 0, 0, 1))


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """A real huggingface_hub cache holding org/tiny-llama (model and tokenizer), offline."""
    files = tmp_path / "files"
    save_llama(files, llama_config(), config_style="v4")
    save_tokenizer(files)
    cache = tmp_path / "hub"
    snapshot = hub_cache(cache, "org/tiny-llama", files)
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return snapshot


def test_hub_id_loads_from_the_cache_offline(offline_hub, tmp_path):
    reference = transformers.AutoModelForCausalLM.from_pretrained(offline_hub).eval()
    for value in ("org/tiny-llama", f"org/tiny-llama@{COMMIT}"):
        sources = pretrained.prepare(_hp(hf_pretrained_model_name_or_dir=value), 0, 0, 1)
        assert sources.model.commit == COMMIT and sources.model.directory == offline_hub
        assert sources.tokenizer == sources.model  # the snapshot holds the tokenizer too
        ours, spec = _ours(offline_hub, _hp(hf_pretrained_model_name_or_dir=value))
        tokens = _tokens(spec.vocab_size)
        with torch.no_grad():
            assert (ours(tokens) - reference(tokens).logits).abs().max().item() <= 1e-5


def test_hub_id_not_in_the_cache_fails_with_the_reason(offline_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRET")
    with pytest.raises(pretrained.PretrainedError) as err:
        pretrained.prepare(_hp(hf_pretrained_model_name_or_dir="org/absent-model"), 0, 0, 1)
    text = str(err.value)
    assert "hyperparameters.hf_pretrained_model_name_or_dir = 'org/absent-model'" in text
    assert "not in the Hugging Face cache" in text and "HF_HUB_OFFLINE=1" in text and "hf download" in text
    assert "hf_SECRETSECRET" not in text


def test_unknown_revision_fails(offline_hub):
    with pytest.raises(pretrained.PretrainedError, match="org/tiny-llama at revision v9"):
        pretrained.prepare(_hp(hf_pretrained_model_name_or_dir="org/tiny-llama@v9"), 0, 0, 1)


def test_a_name_that_is_nothing_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SM_CHANNELS", '["train"]')
    with pytest.raises(pretrained.PretrainedError, match=r"'llama' is not a directory .* \(channels: train\) "
                                                         r"and not a Hugging Face Hub id"):
        pretrained.prepare(_hp(hf_pretrained_model_name_or_dir="llama"), 0, 0, 1)


def test_tokenizer_hyperparameter_without_tokenizer_files_is_refused(tmp_path):
    save_llama(tmp_path / "m", llama_config())
    with pytest.raises(pretrained.PretrainedError, match="hyperparameters.tokenizer .* holds no tokenizer"):
        pretrained.prepare(_hp(model_preset="llama3-tiny", tokenizer=str(tmp_path / "m")), 0, 0, 1)


@pytest.mark.parametrize("error, says", [
    ("GatedRepoError", "is gated; accept its license at https://huggingface.co/meta-llama/Llama-3.1-8B"),
    ("RepositoryNotFoundError", "was not found on the Hub (the token given has no access to it); check the id"),
    ("RevisionNotFoundError", "has no such revision; use a branch, tag or commit hash"),
])
def test_hub_refusals_name_the_model_the_reason_and_the_fix(monkeypatch, error, says):
    """The Hub's answers, as huggingface_hub raises them, become one message (token blanked)."""
    from unittest import mock

    import huggingface_hub
    from huggingface_hub import errors

    def refuse(repo_id, **kwargs):
        raise getattr(errors, error)(f"403 for {repo_id} with hf_SECRETSECRET", response=mock.Mock(headers={}))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRET")
    with pytest.raises(pretrained.PretrainedError) as err:
        pretrained.prepare(_hp(hf_pretrained_model_name_or_dir="meta-llama/Llama-3.1-8B"), 0, 0, 1)
    assert "hyperparameters.hf_pretrained_model_name_or_dir = 'meta-llama/Llama-3.1-8B'" in str(err.value)
    assert says in str(err.value) and "hf_SECRETSECRET" not in str(err.value)


def test_hub_download_fetches_weights_only_where_they_are_read(tmp_path, monkeypatch):
    """First host: config and tokenizer, then safetensors (.bin only if there are none); other
    hosts: config and tokenizer only. Meta's original/ checkpoint is never fetched."""
    import fnmatch
    import shutil

    import huggingface_hub

    repo = tmp_path / "repo"  # what the Hub holds
    save_llama(repo, llama_config(), weights="bin")
    snapshot = tmp_path / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    calls = []

    def download(repo_id, allow_patterns, ignore_patterns, **kwargs):
        calls.append(sorted(p for p in allow_patterns if "model" in p and p != "*.model"))
        assert ignore_patterns == ["original/*"]
        for file in repo.iterdir():  # as huggingface_hub does: only what the patterns allow
            if any(fnmatch.fnmatch(file.name, p) for p in allow_patterns):
                shutil.copyfile(file, snapshot / file.name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    other_host = pretrained._locate("org/m", "f", weights=False)
    assert calls == [[]] and other_host.commit == COMMIT
    assert not list(snapshot.glob("pytorch_model*"))
    calls.clear()
    pretrained._locate("org/m", "f", weights=True)
    assert calls == [[], ["model*.safetensors"], ["pytorch_model*.bin"]]  # no safetensors here: then .bin


def test_a_config_missing_a_required_key_is_named(tmp_path):
    save_llama(tmp_path, llama_config())
    config = json.loads((tmp_path / "config.json").read_text())
    del config["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hp = _hp(hf_pretrained_model_name_or_dir=str(tmp_path))
    with pytest.raises(pretrained.PretrainedError, match="config.json has no 'num_hidden_layers'"):
        pretrained.model_spec(hp, pretrained.prepare(hp, 0, 0, 1))
