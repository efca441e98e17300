"""A LoRA job at world 2 under FSDP2 (issue 52, section 5): train.py's ranks (tests/support/train_runs.py)
fine-tune a tiny transformers Llama with adapters on all its linear layers, sharded with the frozen base,
and merge_weights: the first loss is the base model's (B starts at zero), the adapter peft loads and the
merged model transformers loads compute the same logits, and the base's files are untouched. One job
of 3 steps (~10 s of CPU)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from container.checkpoint.peft_export import MERGED
from container.data.loader import SyntheticSource
from launcher.wire.training.hf_config import spec_from_hf_config
from tests.support.close import assert_close, llama_terms, logits_terms
from tests.support.hf_models import llama_config, save_llama
from tests.support.peft_reference import random_tokens, torchao_off
from tests.support.train_runs import TINY, run_train

transformers = pytest.importorskip("transformers")
SEQ = TINY["max_context_width"]


def _digest(directory) -> str:
    return hashlib.sha256(b"".join(f.read_bytes() for f in sorted(directory.iterdir()))).hexdigest()


def test_fsdp_lora_job_starts_at_the_base_loss_and_exports_what_peft_and_transformers_load(tmp_path):
    from peft import PeftModel

    reference = save_llama(tmp_path / "base", llama_config())
    before = _digest(tmp_path / "base")
    records = run_train(tmp_path / "run", 2, model_preset=None, hf_pretrained_model_name_or_dir=str(tmp_path / "base"),
                        train_batch_size=2, max_steps=3, use_peft=1, lora_target_modules="all-linear", lora_r=8,
                        lora_alpha=16, lora_dropout=0.0, merge_weights=1)
    spec = spec_from_hf_config(json.loads((tmp_path / "base" / "config.json").read_text()), "tiny")
    ids = SyntheticSource(SEQ, reference.config.vocab_size, seed=TINY["seed"]).read(0, 4)["input_ids"]  # step 1
    with torch.no_grad():
        expected = reference(ids, labels=ids).loss.item()
    assert_close(records[0]["loss"], expected, terms=llama_terms(spec, SEQ, 4 * SEQ), dtype=torch.float32,
                 what="first loss")
    assert records[-1]["loss"] < records[0]["loss"]  # the adapters trained
    assert _digest(tmp_path / "base") == before

    model_dir = tmp_path / "run" / "model"
    with torchao_off():
        adapted = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                            model_dir).eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(model_dir / MERGED).eval()
    tokens = random_tokens(reference.config.vocab_size)
    with torch.no_grad():
        logits = adapted(tokens).logits
        assert_close(merged(tokens).logits, logits, terms=logits_terms(spec, SEQ) + 8,  # + the merge's r products
                     what="merged against peft's adapter")
        assert not torch.allclose(reference(tokens).logits, logits)  # control: the adapter is not a no-op

