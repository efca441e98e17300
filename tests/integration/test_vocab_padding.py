"""AWS's SMP v2 notebook trains a vocabulary of 50257 entries at tensor_parallel_degree 2; smlaunch's
runtime pads such a vocabulary (here 251 entries in 256 rows) instead of refusing it. Through
train.py at tp 2: the same losses and gradient norms as one process with the unpadded model, the
same exported model, and its checkpoint resumes at tp 1 (the saved rows kept). A checkpoint of
unpadded rows cannot resume at a degree that does not split them, and says so."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from launcher.wire.training.models import PRESETS
from tests.support.train_runs import assert_same_export, assert_same_training, run_train, series

VOCAB = {"vocab_size": 251}  # prime: no tensor-parallel degree splits it


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref")
    return run_train(path, 1, checkpoint_freq=3, **VOCAB), path


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp2")
    return run_train(path, 2, mp_parameters="tensor_parallel_degree=2", checkpoint_freq=3, **VOCAB), path


def test_tp2_with_a_padded_vocabulary_trains_like_one_process(tp2, reference):
    assert_same_training(tp2[0], reference[0])
    log = (tp2[1] / "rank-logs" / "rank0.log").read_text()
    assert "vocabulary: 251 entries in 256 rows" in log
    assert "vocabulary:" not in (reference[1] / "rank-logs" / "rank0.log").read_text()  # nothing padded at tp 1


def test_the_export_has_the_vocabularys_rows(tp2, reference):
    assert_same_export(tp2[1] / "model", reference[1] / "model", replace(PRESETS["llama3-tiny"], **VOCAB))


def test_a_padded_checkpoint_resumes_at_tp1(tmp_path, tp2, reference):
    shutil.copytree(tp2[1] / "checkpoints" / "step-3", tmp_path / "checkpoints" / "step-3")
    resumed = run_train(tmp_path, 1, checkpoint_freq=3, **VOCAB)
    assert series(resumed, "step") == [4, 5, 6]
    assert series(resumed, "loss") == pytest.approx(series(reference[0], "loss")[3:], rel=1e-5)
    log = (tmp_path / "rank-logs" / "rank0.log").read_text()
    assert "vocabulary: 251 entries in 256 rows (the checkpoint's)" in log


def test_unpadded_rows_do_not_resume_where_they_cannot_split(tmp_path, reference):
    shutil.copytree(reference[1] / "checkpoints" / "step-3", tmp_path / "checkpoints" / "step-3")
    with pytest.raises(AssertionError) as failed:
        run_train(tmp_path, 2, mp_parameters="tensor_parallel_degree=2", checkpoint_freq=3, **VOCAB)
    assert "vocabulary rows (padded for tensor parallelism) (tensor_parallel_degree) was 251 when saved, now 256" \
        in str(failed.value)
    assert "resume with a tensor_parallel_degree that divides 251" in str(failed.value)


def test_tp2_x_fsdp_with_delayed_init_trains_like_one_process(tmp_path, reference):
    # 4 ranks: 2 FSDP ranks x 2 tp ranks, the model built on the meta device (its padding mask
    # recomputed after materialising, split like the logits)
    records = run_train(tmp_path, 4, train_batch_size=2, delayed_param=1, **VOCAB,
                        mp_parameters="tensor_parallel_degree=2,hybrid_shard_degree=2")
    assert_same_training(records, reference[0])
