"""Client-side model resolution: for smlaunch's train.py the model must be known, loadable and
implemented before anything is written or sent; a script of the user's own only gets warnings.
Here the tests that run in one process; those that start processes are tests/integration/test_model_rules.py."""

from __future__ import annotations

import pytest

from launcher.config import ConfigError, validate_job
from launcher.wire.training.model_source import FIELD
from tests.support.hf_models import hub_cache, llama_config, save_llama
from tests.support.model_rules import job, warnings
from tests.support.train_runs import ROOT

pytest.importorskip("transformers")
HP = "hyperparameters"
SEED_SIZES = {"model_type": "llama_v3", "hidden_width": 64, "num_layers": 2, "num_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 256}


def errors(data) -> dict[str, list[str]]:
    try:
        validate_job(data)
    except ConfigError as exc:
        found: dict[str, list[str]] = {}
        for issue in exc.issues:
            assert issue.fix, issue
            found.setdefault(issue.path, []).append(f"{issue.problem}; {issue.fix}")
        return found
    return {}


def test_seed_style_sizes_make_the_model(tmp_path):
    result = validate_job(job(SEED_SIZES))
    spec = result.model
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.intermediate_size,
            spec.vocab_size, spec.rope_theta, spec.max_position_embeddings) == (64, 2, 4, 2, 176, 256, 500000.0, 64)
    assert validate_job(job({**SEED_SIZES, "model_type": "llama_v2", "rotary_emb_base": 1e4})).model.rope_theta == 1e4
    aws_name = {**SEED_SIZES, "llama_intermediate_size": 176}
    del aws_name["intermediate_size"]
    assert validate_job(job(aws_name)).model.intermediate_size == 176


def test_seed_style_sizes_are_checked_against_tensor_parallelism():
    tp3 = job({**SEED_SIZES, "num_heads": 6, "num_key_value_heads": 3}, processes_per_host=4,
              distribution={"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
                  "enabled": True, "parameters": {"tensor_parallel_degree": 4, "hybrid_shard_degree": 1}}}})
    problems = errors(tp3)["distribution.smdistributed.modelparallel.parameters.tensor_parallel_degree"]
    assert any("6 attention heads" in p for p in problems) and any("3 key/value heads" in p for p in problems)


def test_missing_sizes_are_named():
    partial = {k: v for k, v in SEED_SIZES.items() if k not in ("num_layers", "vocab_size")}
    (problem,) = errors(job(partial))[f"{HP}.model_type"]
    assert "num_layers, vocab_size are not set" in problem


def test_a_model_type_train_py_does_not_build_is_refused_for_train_py_only(own_script):
    assert "not a model_type smlaunch's train.py builds" in errors(job({**SEED_SIZES, "model_type": "gpt2"}))[
        f"{HP}.model_type"][0]
    assert errors(job({**SEED_SIZES, "model_type": "gpt2"}, script=own_script)) == {}


def test_unknown_model_is_an_error_for_train_py_only(own_script):
    assert "cannot tell which model" in errors(job({}))[f"{HP}.model_preset"][0]
    assert errors(job({}, script=own_script)) == {}


def test_local_directory_problems(tmp_path, own_script):
    no_config = tmp_path / "empty"
    no_config.mkdir()
    assert "has no config.json" in errors(job({"hf_pretrained_model_name_or_dir": str(no_config)}))[FIELD][0]
    save_llama(tmp_path / "m", llama_config(vocab_size=256))
    (tmp_path / "m" / "model.safetensors").unlink()
    no_weights = job({"hf_pretrained_model_name_or_dir": str(tmp_path / "m")})
    assert "holds no weights" in errors(no_weights)[FIELD][0]
    assert errors(job({"hf_pretrained_model_name_or_dir": str(tmp_path / "m"), "init_from_scratch": 1})) == {}
    assert any("holds no weights" in w for w in warnings(
        job({"hf_pretrained_model_name_or_dir": str(tmp_path / "m")}, script=own_script)))


def test_unimplemented_config_is_refused_by_name(tmp_path):
    save_llama(tmp_path, llama_config(vocab_size=256, attention_bias=True))
    (problem,) = errors(job({"hf_pretrained_model_name_or_dir": str(tmp_path)}))[FIELD]
    assert "attention_bias: true, which smlaunch's runtime does not implement" in problem


def test_pretrained_config_fixes_the_shape(tmp_path):
    save_llama(tmp_path, llama_config(vocab_size=256))
    ok = job({"hf_pretrained_model_name_or_dir": str(tmp_path), "vocab_size": 256, "model_type": "llama_v3"})
    assert validate_job(ok).model.rope_scaling == (8.0, 1.0, 4.0, 64)
    (problem,) = errors(job({"hf_pretrained_model_name_or_dir": str(tmp_path), "num_layers": 4}))[f"{HP}.num_layers"]
    assert "differs from the pretrained model's config.json" in problem and "init_from_scratch" in problem
    both = errors(job({"hf_pretrained_model_name_or_dir": str(tmp_path), "model_preset": "llama3-tiny"}))
    assert "both name the model" in both[f"{HP}.model_preset"][0]


def test_a_channel_holding_the_model(tmp_path):
    save_llama(tmp_path / "m", llama_config(vocab_size=256, tied=True))
    local = job({"hf_pretrained_model_name_or_dir": "weights"}, inputs={"weights": str(tmp_path / "m")})
    assert validate_job(local).model.tie_embeddings
    on_s3 = job({"hf_pretrained_model_name_or_dir": "weights"}, instance_type="ml.p5.48xlarge",
                inputs={"weights": "s3://bucket/llama/"}, processes_per_host=None)
    on_s3.pop("processes_per_host")
    assert validate_job(on_s3).model is None  # read where the job runs; nothing to refuse here


def test_context_longer_than_the_model_was_trained_for_warns(tmp_path):
    save_llama(tmp_path, llama_config(vocab_size=256, max_position_embeddings=32))
    found = warnings(job({"hf_pretrained_model_name_or_dir": str(tmp_path)}))
    assert any("max_context_width = 64: exceeds" in w and "max_position_embeddings (32)" in w for w in found)


def test_block_length_of_a_local_channel_is_checked(tmp_path):
    from container.data.packing import write_jsonl

    write_jsonl([[1] * 32, [2] * 32], tmp_path / "train" / "part.jsonl")
    data = job({"model_preset": "llama3-tiny"}, inputs={"train": str(tmp_path / "train")})
    (problem,) = errors(data)[f"{HP}.max_context_width"]
    assert "channel 'train' holds blocks of 32 tokens" in problem and "set max_context_width: 32" in problem
    assert errors(job({"model_preset": "llama3-tiny", "max_context_width": 32},
                      inputs={"train": str(tmp_path / "train")})) == {}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    save_llama(tmp_path / "files", llama_config(vocab_size=256), config_style="v4")
    hub_cache(tmp_path / "hub", "org/tiny", tmp_path / "files")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_hub_id_resolved_from_the_cache(cache, own_script, no_network):
    assert validate_job(job({"hf_pretrained_model_name_or_dir": "org/tiny"})).model.rope_scaling == (8.0, 1.0, 4.0, 64)
    (problem,) = errors(job({"hf_pretrained_model_name_or_dir": "org/other"}))[FIELD]
    assert "org/other is not in the Hugging Face cache" in problem and "HF_HUB_OFFLINE=1" in problem
    assert errors(job({"hf_pretrained_model_name_or_dir": "org/other"}, script=own_script)) == {}
    known = validate_job(job({"hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B", "max_context_width": 256}))
    assert known.model.name == "llama3.1-8b"  # a known model's shapes, without the network


def test_a_value_that_names_nothing(tmp_path):
    (problem,) = errors(job({"hf_pretrained_model_name_or_dir": "./no/such/dir"}))[FIELD]
    assert "is not a directory" in problem and "not a Hugging Face Hub id" in problem




@pytest.fixture
def runtime_code(tmp_path):
    """A source_dir holding smlaunch's train.py, for the runtime's rules, and room for a tokenizer."""
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "train.py").write_text((ROOT / "entrypoints" / "train.py").read_text())
    return tmp_path / "runtime"


@pytest.mark.parametrize("value", ["./no-such-tokenizer", "no-such-tokenizer", "/no/such/tokenizer"])
def test_a_tokenizer_that_names_nothing_is_refused_by_validate(runtime_code, value, no_network):
    """validate said valid, and the job failed after its start at the tokenizer (issue 49)."""
    (problem,) = errors(job({"model_preset": "llama3-tiny", "tokenizer": value}, runtime_code))[f"{HP}.tokenizer"]
    assert problem.startswith(f"{value!r} is not a directory (") and "not an input channel of the job" in problem
    assert "not a Hugging Face Hub id" in problem
    assert "give a directory (relative to source_dir, or absolute)" in problem


def test_a_tokenizer_the_job_can_load_passes_as_before(runtime_code, tmp_path, own_script, no_network):
    """The controls: a Hub id (not contacted), an input channel's name, a directory relative to the
    code (where the runtime opens it), an absolute one; and a script of the user's own, whose
    hyperparameters are its own."""
    (runtime_code / "tok").mkdir()
    (tmp_path / "tokdata").mkdir()
    base = {"model_preset": "llama3-tiny"}
    assert errors(job({**base, "tokenizer": "meta-llama/Llama-3.1-8B"}, runtime_code)) == {}
    assert errors(job({**base, "tokenizer": "tok-channel"}, runtime_code,
                      inputs={"tok-channel": str(tmp_path / "tokdata")})) == {}
    assert errors(job({**base, "tokenizer": "tok"}, runtime_code)) == {}
    assert errors(job({**base, "tokenizer": str(runtime_code / "tok")}, runtime_code)) == {}
    assert errors(job({"tokenizer": "./no-such-tokenizer"}, own_script)) == {}


def test_a_tokenizer_named_relative_to_the_code_is_checked_where_the_job_loads_it(runtime_code):
    """The client read a relative tokenizer from the job file's directory, the runtime from the code's:
    its vocabulary is checked against the model's from the code (tests/unit/test_validate_data.py
    has the check itself)."""
    from tests.support.hf_models import save_chat_tokenizer

    size = len(save_chat_tokenizer(runtime_code / "tok"))  # more tokens than llama3-tiny's 256
    (problem,) = errors(job({"model_preset": "llama3-tiny", "tokenizer": "tok", "dataset_type": "chat"},
                            runtime_code))[f"{HP}.tokenizer"]
    assert f"its tokenizer ({runtime_code / 'tok' / 'tokenizer.json'}) has {size} tokens" in problem
