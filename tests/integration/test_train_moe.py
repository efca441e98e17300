"""Mixture of experts through train.py: FSDP, context parallelism and expert parallelism (alone,
with FSDP, with hybrid sharding) train the tiny Mixtral exactly like one process, loss, aux loss
and gradient norm; its DCP checkpoints resume without expert parallelism, and the export under
expert parallelism holds every expert."""

from __future__ import annotations

import shutil

import pytest

from container.distributed.expert_parallel import check_moe_layout
from launcher.config import ModelParallelParameters
from launcher.wire.training.models import PRESETS
from tests.support.train_runs import assert_same_export, layout_tolerance, run_train, series

MOE = {"model_preset": "mixtral-tiny"}
REL = layout_tolerance(PRESETS["mixtral-tiny"])  # 6e-5


def assert_same_training(records, reference, rel=REL):
    assert series(records, "step") == series(reference, "step")
    for key in ("loss", "grad_norm", "aux_loss"):
        ours, ref = series(records, key), series(reference, key)
        assert ours == pytest.approx(ref, rel=rel), f"{key}: {ours} != {ref}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref")
    return run_train(path, 1, **MOE), path


@pytest.fixture(scope="module")
def composite(tmp_path_factory):
    """4 ranks: hybrid sharding 2 x 2 with cp 2 inside each sharding group and ep 2 taken from the
    cp ranks; delayed init, activation checkpointing, checkpoints at steps 3 and 6."""
    path = tmp_path_factory.mktemp("composite")
    params = "hybrid_shard_degree=2,context_parallel_degree=2,expert_parallel_degree=2"
    return run_train(path, 4, train_batch_size=2, mp_parameters=params, delayed_param=1,
                     activation_checkpointing=1, checkpoint_freq=3, **MOE), path


def test_reference_learns(reference):
    losses, aux = series(reference[0], "loss"), series(reference[0], "aux_loss")
    assert len(losses) == 6 and losses[-1] < losses[0]
    # 4 experts, 2 per token: 2 when perfectly balanced, up to 4 when every token picks the same two
    assert all(2 <= a < 4 for a in aux)


@pytest.mark.parametrize("nproc,extra", [
    (2, {"train_batch_size": 2}),                                                    # FSDP over 2, ep 1
    (2, {"mp_parameters": "context_parallel_degree=2"}),                             # aux loss split over cp
    (2, {"train_batch_size": 2, "mp_parameters": "expert_parallel_degree=2"}),       # ep 2
    (4, {"train_batch_size": 1, "mp_parameters": "expert_parallel_degree=2"}),       # ep 2 x dp_shard 2
], ids=["fsdp2", "cp2", "ep2", "ep2xdp_shard2"])
def test_layouts_match_single_process(tmp_path, reference, nproc, extra):
    assert_same_training(run_train(tmp_path, nproc, **MOE, **extra), reference[0])


def test_hsdp_cp_ep_with_delayed_init_and_checkpointing_matches(composite, reference):
    assert_same_training(composite[0], reference[0])


def test_expert_parallel_checkpoint_resumes_without_it(tmp_path, composite, reference):
    # DCP reshards the experts' (efsdp, ep) DTensors onto 2 plain FSDP ranks
    shutil.copytree(composite[1] / "checkpoints" / "step-3", tmp_path / "checkpoints" / "step-3")
    resumed = run_train(tmp_path, 2, train_batch_size=2, checkpoint_freq=3, **MOE)
    assert series(resumed, "step") == [4, 5, 6]
    for key in ("loss", "aux_loss"):
        assert series(resumed, key) == pytest.approx(series(reference[0], key)[3:], rel=REL)


def test_export_under_expert_parallelism_holds_every_expert(composite, reference):
    # loading raises unless every expert of every layer is there; then the same logits
    assert_same_export(composite[1] / "model", reference[1] / "model", PRESETS["mixtral-tiny"])


@pytest.mark.parametrize("params, experts, says", [
    ({"expert_parallel_degree": 3}, 4, "does not divide the model's 4 experts"),
    ({"expert_parallel_degree": 2}, 0, "the model is dense"),
    ({"tensor_parallel_degree": 2}, 4, "no tensor parallelism"),
])
def test_runtime_refuses_what_validation_refuses(params, experts, says):
    with pytest.raises(ValueError, match=says):
        check_moe_layout(ModelParallelParameters.model_validate(params), experts)
