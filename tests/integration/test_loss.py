"""Chunked cross-entropy (container/loss.py): the loss and every gradient equal those of the whole
fp32 logits (the reference is F.cross_entropy on the plain model's logits), in one process, under
tensor parallelism's vocabulary-parallel loss, and through train.py with FSDP, tp and cp; and
no tensor of the whole micro-batch's logits exists in forward or backward.
Here the tests that start processes; the rest are tests/unit/test_loss.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from container.distributed.tensor_parallel import apply_tp, loss_context
from container.loss import token_loss_sum
from tests.support.close import order_tolerance
from tests.support.gloo import spawn
from tests.support.loss import TINY, LargestLogits, _assert_close, _batch, _grads, _model, _reference
from tests.support.train_runs import TINY as TINY_RUN
from tests.support.train_runs import run_train, series


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
        _assert_close(loss.detach(), _grads(sharded), want_loss, want)
        assert seen.most == 16  # global shape: each rank holds 16 x V/2


def test_tensor_parallel_chunked_loss_matches_single_process(tmp_path):
    spawn(2, _tp_chunked_matches_single_process, str(tmp_path))


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
