"""Chunked cross-entropy (container/loss.py): the loss and every gradient equal those of the whole
fp32 logits (the reference is F.cross_entropy on the plain model's logits), in one process, under
tensor parallelism's vocabulary-parallel loss, and through train.py with FSDP, tp and cp; and
no tensor of the whole micro-batch's logits exists in forward or backward."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from container.data.loader import IGNORE_INDEX, shift_labels
from container.distributed.tensor_parallel import apply_tp, loss_context
from container.loss import token_loss_sum
from container.models.llama import build_model
from launcher.config import TrainingHyperparameters
from launcher.config.models import PRESETS
from launcher.config.run_settings import DEFAULT_LOSS_CHUNK_TOKENS, run_settings
from tests.support.gloo import spawn
from tests.support.train_runs import TINY as TINY_RUN
from tests.support.train_runs import order_tolerance, run_train, series

SEQ, BATCH = 64, 3  # 192 tokens: no dimension of the model is that long, nor the vocabulary's 256
TINY = PRESETS["llama3-tiny"]
REL = 1e-6


def _model(spec=TINY, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(spec, SEQ)
    model.init_weights()
    return model


def _batch() -> dict:
    tokens = torch.randint(0, TINY.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = shift_labels(tokens)
    labels[0, :20] = IGNORE_INDEX  # padding: the first 16-token chunk has no label at all
    return {"input_ids": tokens, "labels": labels}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _reference(model, batch) -> tuple[torch.Tensor, dict]:
    """The whole-logits loss, independently of container.loss, and its gradients."""
    logits = model(batch["input_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")
    loss.backward()
    return loss.detach(), _grads(model)


def _grads(model) -> dict:
    grads = {name: _full(p.grad).clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def _assert_equal(got_loss, got, want_loss, want) -> None:
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=REL)
    assert got.keys() == want.keys()
    for name in want:  # relative to the tensor's scale: summation order moves each element by ~1e-7
        assert (got[name] - want[name]).abs().max() <= REL * want[name].abs().max(), name


class LargestLogits(TorchDispatchMode):
    """The most token rows of any [tokens..., vocabulary] tensor an operation produced: logits,
    log-probabilities and their gradients (the head's weight, transposed to [hidden, vocabulary]
    in its matmul, is left out; DTensors count by their global shape)."""

    def __init__(self, spec=TINY):
        super().__init__()
        self.vocab, self.hidden, self.most = spec.vocab_size, spec.hidden_size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                rows = t.numel() // self.vocab
                self.most = max(self.most, rows if rows != self.hidden else 0)
        return out


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk", [16, 50, BATCH * SEQ], ids=["16", "uneven-50", "one-chunk"])
def test_chunked_loss_and_gradients_equal_whole_logits(chunk, tied):
    model, batch = _model(replace(TINY, tie_embeddings=tied)), _batch()
    want_loss, want = _reference(model, batch)
    loss, tokens = token_loss_sum(model, batch, chunk)
    loss.backward()
    assert tokens.item() == (batch["labels"] != IGNORE_INDEX).sum().item() == BATCH * (SEQ - 1) - 20
    _assert_equal(loss.detach(), _grads(model), want_loss, want)


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
    assert got.item() == pytest.approx(want.item(), rel=REL)
    assert seen.most == 16


def test_forward_without_labels_returns_the_logits():
    model, batch = _model(), _batch()
    assert model(batch["input_ids"]).shape == (BATCH, SEQ, TINY.vocab_size)


def _tp_chunked_matches_single_process(root: str) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    batch = _batch()
    for tied in (False, True):
        spec = replace(TINY, tie_embeddings=tied)
        want_loss, want = _reference(_model(spec), batch)
        sharded = _model(spec)
        apply_tp(sharded, mesh["tp"])
        with LargestLogits() as seen, loss_context(2):
            loss, _ = token_loss_sum(sharded, batch, 16)
            loss.backward()
        _assert_equal(loss.detach(), _grads(sharded), want_loss, want)
        assert seen.most == 16  # global shape: each rank holds 16 x V/2


def test_tensor_parallel_chunked_loss_matches_single_process(tmp_path):
    spawn(2, _tp_chunked_matches_single_process, str(tmp_path))


def test_chunking_is_on_by_default_and_zero_turns_it_off():
    assert run_settings(TrainingHyperparameters(), None, 1).loss_chunk_tokens == DEFAULT_LOSS_CHUNK_TOKENS > 0
    assert run_settings(TrainingHyperparameters(loss_chunk_tokens=0), None, 1).loss_chunk_tokens == 0


# train.py with chunks of 16 tokens against the whole logits, per layout: loss and grad_norm
# series equal up to the reordering of a step's sums over its tokens (TINY: 4 sequences x 64).
@pytest.mark.parametrize("nproc,hyperparameters", [
    (2, {"train_batch_size": 2}),  # FSDP over dp_shard 2
    (2, {"mp_parameters": "tensor_parallel_degree=2"}),
    (2, {"mp_parameters": "context_parallel_degree=2"}),
], ids=["fsdp2", "tp2", "cp2"])
def test_train_with_chunked_loss_matches_whole_logits(tmp_path, nproc, hyperparameters):
    chunked = run_train(tmp_path / "chunked", nproc, loss_chunk_tokens=16, **hyperparameters)
    whole = run_train(tmp_path / "whole", nproc, loss_chunk_tokens=0, **hyperparameters)
    rel = order_tolerance(TINY_RUN["train_batch_size"] * TINY_RUN["max_context_width"])
    for key in ("loss", "grad_norm"):
        assert series(chunked, key) == pytest.approx(series(whole, key), rel=rel), key
