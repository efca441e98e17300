"""Tensor parallelism through train.py: tp = 2 (alone and with FSDP) trains like one process,
its DCP checkpoints resume on another layout, and it exports the full Hugging Face model."""

from __future__ import annotations

import shutil

import pytest

from launcher.wire.training.models import PRESETS
from tests.support.train_runs import assert_same_export, assert_same_training, run_train, series


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref")
    return run_train(path, 1), path


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    # the two tp ranks share one batch: the global batch of 4 is one data-parallel rank's;
    # checkpoints at steps 3 and 6 (saving does not change the numerics)
    path = tmp_path_factory.mktemp("tp2")
    return run_train(path, 2, mp_parameters="tensor_parallel_degree=2", checkpoint_freq=3), path


def test_tp2_matches_single_process(tp2, reference):
    assert_same_training(tp2[0], reference[0])


def test_tp2_with_fsdp2_matches_single_process(tmp_path, reference):
    # 4 ranks: 2 data-parallel ranks (FSDP shards over them) x 2 tp ranks; 2 sequences each
    params = "tensor_parallel_degree=2,hybrid_shard_degree=2"
    assert_same_training(run_train(tmp_path, 4, train_batch_size=2, mp_parameters=params), reference[0])


def test_tp2_checkpoint_resumes_without_tp(tmp_path, tp2, reference):
    # DCP reshards the TP x FSDP parameters and optimizer states onto 2 plain FSDP ranks
    shutil.copytree(tp2[1] / "checkpoints" / "step-3", tmp_path / "checkpoints" / "step-3")
    resumed = run_train(tmp_path, 2, train_batch_size=2, checkpoint_freq=3)
    assert series(resumed, "step") == [4, 5, 6]
    assert series(resumed, "loss") == pytest.approx(series(reference[0], "loss")[3:], rel=1e-5)


def test_tp2_exports_the_full_model(tp2, reference):
    # the export loads into a plain model that computes the reference's logits
    assert_same_export(tp2[1] / "model", reference[1] / "model", PRESETS["llama3-tiny"])
