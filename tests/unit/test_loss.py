"""Chunked cross-entropy (container/loss.py): the loss and every gradient equal those of the whole
fp32 logits (the reference is F.cross_entropy on the plain model's logits), in one process, under
tensor parallelism's vocabulary-parallel loss, and through train.py with FSDP, tp and cp; and
no tensor of the whole micro-batch's logits exists in forward or backward.
Here the tests that run in one process; those that start processes are tests/integration/test_loss.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from container.data.loader import IGNORE_INDEX
from container.loss import token_loss_sum
from launcher.config import TrainingHyperparameters
from launcher.wire.training.run_settings import DEFAULT_LOSS_CHUNK_TOKENS, run_settings
from tests.support.close import assert_close
from tests.support.loss import BATCH, SEQ, TERMS, TINY, LargestLogits, _assert_close, _batch, _grads, _model, _reference


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk", [16, 50, BATCH * SEQ], ids=["16", "uneven-50", "one-chunk"])
def test_chunked_loss_and_gradients_equal_whole_logits(chunk, tied):
    model, batch = _model(replace(TINY, tie_embeddings=tied)), _batch()
    want_loss, want = _reference(model, batch)
    loss, tokens = token_loss_sum(model, batch, chunk)
    loss.backward()
    assert tokens.item() == (batch["labels"] != IGNORE_INDEX).sum().item() == BATCH * (SEQ - 1) - 20
    _assert_close(loss.detach(), _grads(model), want_loss, want)


def test_no_tensor_of_the_whole_logits_exists():
    model, batch = _model(), _batch()
    sizes = {}
    for chunk in (0, 16):
        with LargestLogits() as seen:
            loss, _ = token_loss_sum(model, batch, chunk)
            loss.backward()
        sizes[chunk] = seen.most
    assert sizes == {0: BATCH * SEQ, 16: 16}


def test_validation_without_grad_is_chunked_and_equal():
    model, batch = _model(), _batch()
    with torch.no_grad():
        want, _ = token_loss_sum(model, batch, 0)
        with LargestLogits() as seen:
            got, _ = token_loss_sum(model, batch, 16)
    assert_close(got, want, terms=TERMS, what="loss")
    assert seen.most == 16


def test_forward_without_labels_returns_the_logits():
    model, batch = _model(), _batch()
    assert model(batch["input_ids"]).shape == (BATCH, SEQ, TINY.vocab_size)


def test_chunking_is_on_by_default_and_zero_turns_it_off():
    assert run_settings(TrainingHyperparameters(), None, 1).loss_chunk_tokens == DEFAULT_LOSS_CHUNK_TOKENS > 0
    assert run_settings(TrainingHyperparameters(loss_chunk_tokens=0), None, 1).loss_chunk_tokens == 0


