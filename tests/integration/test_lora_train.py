"""LoRA jobs at world 2 under FSDP2 (issue 52, section 5): train.py's ranks (tests/support/train_runs.py)
fine-tune a tiny transformers Llama with adapters on all its linear layers, sharded with the frozen base,
dropout on, and merge_weights: the first loss is the base model's (B starts at zero), the adapter peft
loads and the merged model transformers loads compute the same logits, the base's files are untouched,
and a run resumed from its checkpoint steps as the uninterrupted one did (its dropout masks too), but a
resume on a base with other weights is refused. Four short jobs: 3 steps, 2 steps, then 1 resumed (~20 s
of CPU), and the refused one (~2 s). The same three
jobs with QLoRA (load_in_4bit), on a Llama whose linear layers NF4 quantizes whole: the first loss is the NF4
base's (written out in tests/support/nf4_reference.py), the merged model is that base plus the adapter's
update, and the resumed run, whose checkpoint holds no base, steps as the uninterrupted one."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import FileSystemReader

from container.checkpoint.peft_export import MERGED
from container.data.loader import SyntheticSource
from launcher.wire.training.hf_config import spec_from_hf_config
from tests.support.close import assert_close, llama_terms, logits_terms
from tests.support.hf_models import llama_config, save_llama
from tests.support.nf4_reference import QLORA_SHAPES, nf4_base
from tests.support.peft_reference import random_tokens, torchao_off
from tests.support.train_runs import TINY, assert_same_training, run_train, series

transformers = pytest.importorskip("transformers")
SEQ = TINY["max_context_width"]
LORA = {"use_peft": 1, "lora_target_modules": "all-linear", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
        "merge_weights": 1, "train_batch_size": 2, "checkpoint_freq": 2, "lr_decay_iters": 3}


def _digest(directory) -> str:
    return hashlib.sha256(b"".join(f.read_bytes() for f in sorted(directory.iterdir()))).hexdigest()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the base's directory, transformers' model of it, its digest before, the 3-step run's directory and records)."""
    tmp = tmp_path_factory.mktemp("lora")
    reference = save_llama(tmp / "base", llama_config())
    before = _digest(tmp / "base")
    records = run_train(tmp / "run", 2, model_preset=None, hf_pretrained_model_name_or_dir=str(tmp / "base"),
                        max_steps=3, **LORA)
    return tmp / "base", reference, before, tmp / "run", records


def test_fsdp_lora_job_starts_at_the_base_loss_and_exports_what_peft_and_transformers_load(trained):
    from peft import PeftModel

    base, reference, before, run, records = trained
    spec = spec_from_hf_config(json.loads((base / "config.json").read_text()), "tiny")
    ids = SyntheticSource(SEQ, reference.config.vocab_size, seed=TINY["seed"]).read(0, 4)["input_ids"]  # step 1
    with torch.no_grad():
        expected = reference(ids, labels=ids).loss.item()
    assert_close(records[0]["loss"], expected, terms=llama_terms(spec, SEQ, 4 * SEQ), dtype=torch.float32,
                 what="first loss")
    assert _digest(base) == before

    with torchao_off():
        adapted = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base),
                                            run / "model").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(run / "model" / MERGED).eval()
    tokens = random_tokens(reference.config.vocab_size)
    with torch.no_grad():
        logits = adapted(tokens).logits
        assert_close(merged(tokens).logits, logits, terms=logits_terms(spec, SEQ) + 8,  # + the merge's r products
                     what="merged against peft's adapter")
        assert not torch.allclose(reference(tokens).logits, logits)  # control: the adapter is not a no-op


def test_a_resumed_lora_run_steps_as_the_uninterrupted_one(trained, tmp_path):
    base, _, _, _, records = trained
    hp = {"model_preset": None, "hf_pretrained_model_name_or_dir": str(base), **LORA}
    run_train(tmp_path, 2, max_steps=2, **hp)
    saved = FileSystemReader(tmp_path / "checkpoints" / "step-2").read_metadata().state_dict_metadata
    assert "model.layers.0.attention.wq.weight" in saved  # LoRA's checkpoint holds the frozen base (QLoRA's not)
    resumed = run_train(tmp_path, 2, max_steps=3, **hp)  # from the checkpoint of step 2
    assert series(resumed, "step") == [1, 2, 3]
    assert_same_training(resumed, records, rel=0)


def test_a_lora_run_is_not_resumed_on_another_base(trained, tmp_path):
    """The resume above, on the same base, is the control."""
    base, _, _, run, _ = trained
    shutil.copytree(base, tmp_path / "other")
    weights = load_file(tmp_path / "other" / "model.safetensors")
    weights["model.norm.weight"] += 1
    save_file(weights, tmp_path / "other" / "model.safetensors", metadata={"format": "pt"})
    shutil.copytree(run / "checkpoints", tmp_path / "checkpoints")
    with pytest.raises(AssertionError, match=r"base model \(hf_pretrained_model_name_or_dir and its weights\) was "
                       f"directory {base}, weights sha256 .* now directory {tmp_path / 'other'}, weights sha256"):
        run_train(tmp_path, 2, max_steps=4, model_preset=None, hf_pretrained_model_name_or_dir=str(tmp_path / "other"),
                  **LORA)


QLORA = {**LORA, "load_in_4bit": 1}


@pytest.fixture(scope="module")
def qlora_trained(tmp_path_factory):
    """(the QLoRA base's directory, transformers' model of it, the 3-step run's directory and records)."""
    tmp = tmp_path_factory.mktemp("qlora")
    reference = save_llama(tmp / "base", llama_config(**QLORA_SHAPES))
    records = run_train(tmp / "run", 2, model_preset=None, hf_pretrained_model_name_or_dir=str(tmp / "base"),
                        max_steps=3, **QLORA)
    return tmp / "base", reference, tmp / "run", records


def test_a_qlora_job_starts_at_the_nf4_base_s_loss_and_merges_onto_it(qlora_trained):
    from peft import PeftModel

    base, reference, run, records = qlora_trained
    spec = spec_from_hf_config(json.loads((base / "config.json").read_text()), "tiny")
    ids = SyntheticSource(SEQ, reference.config.vocab_size, seed=TINY["seed"]).read(0, 4)["input_ids"]
    terms = llama_terms(spec, SEQ, 4 * SEQ)
    with torch.no_grad():
        original = reference(ids, labels=ids).loss.item()
        quantized = nf4_base(reference)
        expected = quantized(ids, labels=ids).loss.item()
    assert_close(records[0]["loss"], expected, terms=terms, dtype=torch.float32, what="first loss")
    with pytest.raises(AssertionError, match="off by more than"):  # control: the original base's loss
        assert_close(records[0]["loss"], original, terms=terms, dtype=torch.float32, what="the original base's loss")

    with torchao_off():
        adapted = PeftModel.from_pretrained(quantized, run / "model").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(run / "model" / MERGED).eval()
    tokens = random_tokens(reference.config.vocab_size)
    with torch.no_grad():
        assert_close(merged(tokens).logits, adapted(tokens).logits, terms=logits_terms(spec, SEQ) + 8,
                     what="merged against peft's adapter on the NF4 base")


def test_a_resumed_qlora_run_steps_as_the_uninterrupted_one(qlora_trained, tmp_path):
    """Its checkpoint holds the adapters and their optimizer state, not the NF4 base, which the resumed
    run loads and quantizes again as the first did."""
    base, _, _, records = qlora_trained
    hp = {"model_preset": None, "hf_pretrained_model_name_or_dir": str(base), **QLORA}
    run_train(tmp_path, 2, max_steps=2, **hp)
    saved = FileSystemReader(tmp_path / "checkpoints" / "step-2").read_metadata().state_dict_metadata
    assert "model.layers.0.attention.wq.lora_A.weight" in saved and "model.norm.weight" in saved
    assert not any(key.startswith("model.layers.") and "lora_" not in key and "norm" not in key for key in saved)
    resumed = run_train(tmp_path, 2, max_steps=3, **hp)  # from the checkpoint of step 2
    assert series(resumed, "step") == [1, 2, 3]
    assert_same_training(resumed, records, rel=0)
