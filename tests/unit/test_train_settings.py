"""What a run does is decided once (launcher.wire.training.run_settings): the trainer runs it and the
planner sizes it, so a default changed there reaches both."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from container import trainer
from launcher.cli.app import _summary
from launcher.config import ModelParallelParameters, TrainingHyperparameters, validate_job
from launcher.plan.workload import workload_of
from launcher.wire.training import run_settings as rs
from launcher.wire.training.run_settings import run_settings

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"


def test_bf16_comes_from_the_hyperparameter_or_smp_v1_parameters():
    hp = TrainingHyperparameters()
    assert run_settings(hp, None, 1).bf16 is False
    assert run_settings(hp, ModelParallelParameters(bf16=True), 1).bf16 is True  # parameters: {bf16: true}
    assert run_settings(TrainingHyperparameters(bf16=1), None, 1).bf16 is True


def test_sharded_data_parallel_clip_is_the_default_clip():
    sdp = ModelParallelParameters(sharded_data_parallel_degree=2, sdp_gradient_clipping=0.5)
    assert run_settings(TrainingHyperparameters(), sdp, 2).grad_clip == 0.5
    assert run_settings(TrainingHyperparameters(grad_clip=2.0), sdp, 2).grad_clip == 2.0
    assert run_settings(TrainingHyperparameters(), None, 2).grad_clip == rs.DEFAULT_GRAD_CLIP


def test_offload_needs_checkpointing_and_fsdp_needs_two_ranks_or_bf16():
    s = run_settings(TrainingHyperparameters(offload_activations=1), None, 1)
    assert s.offload is False and s.ac_mode is None and s.fsdp is False
    s = run_settings(TrainingHyperparameters(activation_checkpointing=1, offload_activations=1), None, 2)
    assert s.offload is True and s.ac_mode == "full" and s.fsdp is True
    assert run_settings(TrainingHyperparameters(sharding_strategy="shard_grad_op"), None,
                        2).reshard_after_forward is False


def test_a_default_changed_in_one_place_reaches_the_trainer_and_the_planner(monkeypatch):
    job = validate_job({"entry_point": "train.py", "source_dir": "entrypoints", "instance_type": "ml.p4d.24xlarge",
                        "role": "arn:aws:iam::111122223333:role/R", "image_uri": IMAGE,
                        "hyperparameters": {"model_preset": "llama3.2-1b"}}, base_dir=ROOT)
    monkeypatch.setattr(rs, "DEFAULT_SEQ_LEN", 4096)
    rt = SimpleNamespace(params=ModelParallelParameters(), world_size=job.layout.world)  # what the trainer gets
    assert trainer.settings(rt, job.config.hyperparameters).seq_len == 4096
    assert workload_of(job).seq_len == 4096
    assert job.settings.seq_len == 4096 and _summary(job)["sequence_length"] == 4096  # what validate shows


def test_the_container_refuses_a_layout_with_the_clients_own_check():
    """One divisibility check (launcher.wire.training.layout.layout_problems): what validation reports
    is what the runtime refuses for a job built by hand."""
    from container.distributed.runtime import _check_layout
    from launcher.wire.training.layout import layout_problems

    params = ModelParallelParameters(context_parallel_degree=3, hybrid_shard_degree=2)
    assert [(p.key, p.value) for p in layout_problems(params, 4)] == [("context_parallel_degree", 3)] * 2
    with pytest.raises(ValueError) as refused:
        _check_layout(params, 4)
    for found in layout_problems(params, 4):
        assert f"{found.key} {found.value}: {found.problem}" in str(refused.value)
    _check_layout(ModelParallelParameters(context_parallel_degree=2, hybrid_shard_degree=2), 4)  # tiles: no error


def test_the_seeds_sharding_strategy_gives_validation_the_runtimes_layout():
    """sharding_strategy: hybrid_shard shards within a host: the planner sizes that layout."""
    job = validate_job({"entry_point": "train.py", "source_dir": "entrypoints", "instance_type": "ml.p4d.24xlarge",
                        "instance_count": 2, "role": "arn:aws:iam::111122223333:role/R", "image_uri": IMAGE,
                        "distribution": {"torch_distributed": {"enabled": True}},
                        "hyperparameters": {"model_preset": "llama3.2-1b", "sharding_strategy": "hybrid_shard"}},
                       base_dir=ROOT)
    assert (job.layout.dp_replicate, job.layout.sharding_group) == (2, 8)
    assert workload_of(job).layout == job.layout
