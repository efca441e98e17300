"""Every sharding layout trains exactly like one process: same per-step loss and gradient norm.

train.py runs as users run it (torchrun, gloo on 127.0.0.1, synthetic data, tiny Llama, fp32);
the reference is the same script on one process.
"""

from __future__ import annotations

import pytest

from tests.support.train_runs import assert_same_training, run_train, series


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_train(tmp_path_factory.mktemp("ref"), 1)




def test_reference_learns(reference):
    losses = series(reference, "loss")
    assert len(losses) == 6 and losses[-1] < losses[0]


@pytest.mark.parametrize("nproc,extra", [
    (4, {"mp_parameters": "hybrid_shard_degree=0"}),             # full sharding over 4 ranks
    (4, {"mp_parameters": "hybrid_shard_degree=2"}),             # hybrid sharding 2 x 2
    (2, {"sharding_strategy": "shard_grad_op"}),
    (2, {"sharding_strategy": "no_shard"}),
], ids=["fsdp4", "hsdp2x2", "shard_grad_op", "no_shard"])
def test_layouts_match_single_process(tmp_path, reference, nproc, extra):
    # every rank here is a data-parallel rank: the same 4-sequence global batch, split nproc ways
    assert_same_training(run_train(tmp_path, nproc, train_batch_size=4 // nproc, **extra), reference)


def test_delayed_init_matches_eager(tmp_path, reference):
    assert_same_training(run_train(tmp_path, 2, train_batch_size=2, delayed_param=1), reference)


def test_grad_accumulation_matches_the_whole_batch(tmp_path, reference):
    # 2 ranks x micro-batch 1 x 2 accumulation steps see the reference's 4 sequences per step
    assert_same_training(run_train(tmp_path, 2, train_batch_size=1, gradient_accumulation_steps=2), reference)


def test_activation_checkpointing_keeps_numerics(tmp_path, reference):
    assert_same_training(run_train(tmp_path / "full", 2, train_batch_size=2, activation_checkpointing=1), reference)
    assert_same_training(run_train(tmp_path / "sel", 1, activation_checkpointing=1,
                                   activation_checkpointing_mode="selective", offload_activations=1), reference)


def test_torchtitan_checkpointing_policies_and_fused_adamw_keep_numerics(tmp_path, reference):
    # FSDP2's DTensor parameters through torch's fused AdamW (the default on CUDA), the op policy on
    # every second block (the tiny model's second); the reference runs torch's for-loop AdamW
    assert_same_training(run_train(tmp_path, 2, train_batch_size=2, activation_checkpointing=1,
                                   activation_checkpointing_mode="selective_op", activation_checkpointing_freq=2,
                                   optimizer_implementation="fused"), reference)


def test_smp_v1_sharded_data_parallel_settings_keep_numerics(tmp_path, reference):
    # sharded_data_parallel_degree 2 of 2 ranks, with a live-parameter limit (explicit prefetch
    # of one block) and a persistence threshold that keeps the small tiny-model blocks gathered
    params = ("sharded_data_parallel_degree=2,ddp=true,sdp_max_live_parameters=100000,"
              "sdp_param_persistence_threshold=60000,sdp_gradient_clipping=1.0")
    assert_same_training(run_train(tmp_path, 2, train_batch_size=2, mp_parameters=params), reference)
