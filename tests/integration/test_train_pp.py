"""Pipeline parallelism through train.py: every schedule and every composition (FSDP2, tensor and
context parallelism) trains like one process, its checkpoints resume exactly (at pp2 and, resharded,
at pp1), and the export holds the whole model.

The reference is the same script on one process; TINY's lr shows a layout bug in the loss.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from launcher.wire.training.models import PRESETS
from tests.support.train_runs import assert_same_export, assert_same_training, run_train, series

PP2 = "pipeline_parallel_degree=2,microbatches=2"
INTERLEAVED = f"{PP2},pipeline_schedule=interleaved_1f1b,pipeline_virtual_stages=2"
LAYERS = 4  # TINY's model with 4 layers: 4 stages of one layer interleaved, or 2 of two


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref")
    return run_train(path, 1, num_layers=LAYERS), path


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory):
    # interleaved 1F1B: rank 0 runs layers 0 and 2, rank 1 layers 1 and 3; the batch of 4 in 2
    # microbatches; checkpoints at steps 3 and 6
    path = tmp_path_factory.mktemp("pp2")
    return run_train(path, 2, num_layers=LAYERS, mp_parameters=INTERLEAVED, checkpoint_freq=3), path


def test_interleaved_1f1b_matches_single_process(interleaved, reference):
    assert_same_training(interleaved[0], reference[0])


@pytest.mark.parametrize("nproc,extra", [
    # 1F1B (SMP v1's default `pipeline: interleaved`); the last stage's loss in chunks of 48 tokens
    (2, {"mp_parameters": PP2, "loss_chunk_tokens": 48}),
    # GPipe (SMP v1's `pipeline: simple`) x FSDP2 over 2 data-parallel ranks, 2 sequences each
    (4, {"train_batch_size": 2, "mp_parameters": f"{PP2},pipeline=simple"}),
    (4, {"mp_parameters": f"{PP2},tensor_parallel_degree=2"}),
    # 4 microbatches of one sequence, each cut over 2 cp ranks
    (4, {"mp_parameters": "pipeline_parallel_degree=2,microbatches=4,context_parallel_degree=2"}),
], ids=["1f1b", "gpipe_x_fsdp2", "1f1b_x_tp2", "1f1b_x_cp2"])
def test_pp2_layouts_match_single_process(tmp_path, reference, nproc, extra):
    assert_same_training(run_train(tmp_path, nproc, num_layers=LAYERS, **extra), reference[0])


@pytest.mark.parametrize("nproc,extra", [(2, {"mp_parameters": INTERLEAVED}), (1, {})], ids=["at_pp2", "at_pp1"])
def test_pipeline_checkpoint_resumes_exactly(tmp_path, interleaved, reference, nproc, extra):
    # the stages' parameters and optimizer states under their global names: at pp1, DCP loads
    # the four stages' shards into the one model
    shutil.copytree(interleaved[1] / "checkpoints" / "step-3", tmp_path / "checkpoints" / "step-3")
    resumed = run_train(tmp_path, nproc, num_layers=LAYERS, checkpoint_freq=3, **extra)
    assert series(resumed, "step") == [4, 5, 6]
    for key in ("loss", "grad_norm"):
        assert series(resumed, key) == pytest.approx(series(reference[0], key)[3:], rel=1e-5)


def test_pipeline_exports_the_whole_model(interleaved, reference):
    assert_same_export(interleaved[1] / "model", reference[1] / "model",
                       replace(PRESETS["llama3-tiny"], num_layers=LAYERS))
