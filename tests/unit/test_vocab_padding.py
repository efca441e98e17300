"""A vocabulary tensor parallelism cannot split is padded (launcher.wire.training.models.vocab_rows): the
padded model draws the same initial weights as the unpadded one, its padding logits are masked to
-inf so its loss is the unpadded model's, transformers' weights load into it, and it exports the
vocabulary's rows only. Under tp through train.py: tests/integration/test_vocab_padding.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from container.checkpoint.hf_export import export_hf, load_hf_weights
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS, VOCAB_MULTIPLE, vocab_rows
from tests.support.close import assert_close

SPEC = replace(PRESETS["llama3-tiny"], vocab_size=251)
SEQ = 16


def _model(rows=None, seed=0):
    model = build_model(SPEC, SEQ, vocab_rows=rows)
    torch.manual_seed(seed)
    model.init_weights()
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SPEC.vocab_size, (2, SEQ), generator=g)
    return tokens, torch.randint(0, SPEC.vocab_size, (2, SEQ), generator=g)


def test_rows_follow_megatrons_multiple_and_keep_a_checkpoints_rows():
    assert vocab_rows(50257, 1) == 50257 and vocab_rows(256, 2) == 256  # nothing to pad
    assert VOCAB_MULTIPLE == 128 and vocab_rows(50257, 2) == 50304 == vocab_rows(50257, 8)  # 393 x 128
    assert vocab_rows(251, 3) == 384  # lcm(128, 3) = 384
    assert vocab_rows(50257, 1, saved=50304) == 50304  # resuming a tp 2 checkpoint at tp 1
    assert vocab_rows(50257, 4, saved=50304) == 50304
    assert vocab_rows(50257, 2, saved=50257) == 50304  # the saved rows do not split: padded (resume refuses)


def test_a_padded_model_is_the_unpadded_model():
    tokens, labels = _batch()
    plain, padded = _model(), _model(rows=256)
    assert padded.tok_embeddings.weight.shape[0] == 256 and padded.output.weight.shape[0] == 256
    # the same initial weights: the padding rows draw nothing
    assert torch.equal(padded.tok_embeddings.weight[:251], plain.tok_embeddings.weight)
    assert torch.equal(padded.output.weight[:251], plain.output.weight)
    assert padded.tok_embeddings.weight[251:].abs().sum() == 0
    # Logits of the vocabulary only, close rather than equal: the head's product has 256 rows where
    # the plain model's has 251, and a BLAS may block them differently (MKL_CBWR=COMPATIBLE does).
    with torch.no_grad():
        assert_close(padded(tokens), plain(tokens), terms=SPEC.hidden_size, what="logits")
    loss, count = padded(tokens, labels=labels)
    ref, ref_count = plain(tokens, labels=labels)
    assert count == ref_count
    # then the softmax's sum over the vocabulary and the sum over the tokens
    terms = SPEC.hidden_size + SPEC.vocab_size + tokens.numel()
    assert_close(loss, ref, terms=terms, what="loss")
    loss.backward()
    ref.backward()
    assert_close(padded.output.weight.grad[:251], plain.output.weight.grad, terms=terms, what="head's gradient")
    assert padded.output.weight.grad[251:].abs().sum() == 0  # the padding never learns

    # the control: without the mask the padding's logits (0) take probability, and the loss differs
    del padded.output._buffers["vocab_mask"]
    unmasked, _ = padded(tokens, labels=labels)
    assert abs(unmasked.item() - ref.item()) > 1e-3 * abs(ref.item())


def test_transformers_weights_load_padded_and_the_export_drops_the_padding(tmp_path):
    plain = _model(seed=3)
    export_hf(plain, SPEC, tmp_path / "plain", dtype=torch.float32)
    padded = build_model(SPEC, SEQ, vocab_rows=256)
    load_hf_weights(padded, tmp_path / "plain")
    assert torch.equal(padded.tok_embeddings.weight[:251], plain.tok_embeddings.weight)
    assert padded.output.weight[251:].abs().sum() == 0
    export_hf(padded, SPEC, tmp_path / "padded", dtype=torch.float32)
    from safetensors.torch import load_file

    ours, ref = (load_file(tmp_path / name / "model.safetensors") for name in ("padded", "plain"))
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in ref.items()}
    assert ours["lm_head.weight"].shape[0] == 251 and all(torch.equal(ours[k], ref[k]) for k in ref)


def test_transformers_computes_the_padded_models_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    padded = _model(rows=256, seed=4)
    export_hf(padded, SPEC, tmp_path / "export", dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", torch_dtype=torch.float32)
    tokens, _ = _batch()
    with torch.no_grad():
        ours, theirs = padded(tokens), hf(tokens).logits
    assert theirs.shape[-1] == 251
    assert (ours - theirs).abs().max().item() <= 1e-5 * theirs.abs().max().item()
