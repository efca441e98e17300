"""Context parallelism through train.py trains exactly like one process: same per-step loss and
gradient norm, alone, with activation checkpointing, inside hybrid sharding, and with tensor
parallelism.

Every run sees the reference's global batch of 4 sequences per step: train_batch_size is the
batch of one data-parallel rank, and cp ranks share their data-parallel rank's batch.

A higher learning rate than the shared parity runs' lets attention matter within 8 steps: there,
wrong RoPE positions (every rank at 0..S/cp-1) move loss and grad_norm by 1e-3 relative, while at
lr 0.003 over 6 steps they stayed under the 1e-5 tolerance.
"""

from __future__ import annotations

import pytest

from tests.support.train_runs import assert_same_training, run_train

SENSITIVE = {"lr": 0.03, "min_lr": 0.003, "max_steps": 8}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_train(tmp_path_factory.mktemp("ref"), 1, **SENSITIVE)


@pytest.mark.parametrize("nproc,batch,params,extra", [
    (2, 4, "context_parallel_degree=2", {}),
    (2, 4, "context_parallel_degree=2", {"activation_checkpointing": 1}),
    (4, 4, "context_parallel_degree=4,hybrid_shard_degree=4", {}),
    # dp_shard 2 x cp 2: FSDP shards over all 4 ranks, two data-parallel batches
    (4, 2, "context_parallel_degree=2,hybrid_shard_degree=4", {}),
    # the done-when: dp_replicate 2 x dp_shard 1 x cp 2 (hybrid sharding groups of 2 = the cp pairs)
    (4, 2, "context_parallel_degree=2,hybrid_shard_degree=2",
     {"activation_checkpointing": 1, "activation_checkpointing_mode": "selective"}),
    # tp 2 x cp 2: the tp pair shares each cp chunk; one data-parallel batch
    (4, 4, "tensor_parallel_degree=2,context_parallel_degree=2", {}),
], ids=["cp2", "cp2-checkpointed", "cp4", "dp_shard2-cp2", "hsd2-cp2", "tp2-cp2"])
def test_context_parallel_matches_single_process(tmp_path, reference, nproc, batch, params, extra):
    records = run_train(tmp_path, nproc, train_batch_size=batch, mp_parameters=params, **SENSITIVE, **extra)
    assert len(records) == 8
    assert_same_training(records, reference)
