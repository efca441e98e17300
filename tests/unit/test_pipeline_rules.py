"""Pipeline parallelism's validation: what cannot run is refused with the field, the value and a
fix, by the client and, with the same words, by the container; `smlaunch validate` shows the
pipeline; the planner sizes one stage."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.config import ModelParallelParameters, ParallelLayout, validate_job
from launcher.wire.training.layout import layout_problems
from launcher.wire.training.models import PRESETS
from launcher.wire.training.run_settings import run_settings
from tests.support.config_checks import MP, only_issue, paths

HP = "hyperparameters"


def local_job(runtime_dir, nproc=2, params=None, **hp):
    """llama3-tiny (2 layers, untied) on `nproc` local processes, batch 4 per data-parallel rank."""
    return {
        "entry_point": "train.py", "source_dir": str(runtime_dir), "instance_type": "local",
        "processes_per_host": nproc,
        "hyperparameters": {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64,
                            "train_batch_size": 4, **hp},
        "distribution": {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
            "enabled": True, "parameters": {"pipeline_parallel_degree": 2, "microbatches": 2, **(params or {})}}}},
    }


def test_pipeline_layout(runtime_dir):
    job = validate_job(local_job(runtime_dir, 8, {"tensor_parallel_degree": 2}))
    # pp outermost; each stage's 4 ranks: tp 2 x an FSDP group of 2 (world / (pp x tp))
    assert job.layout == ParallelLayout(world=8, dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=2)
    assert job.layout.mesh_shape == (2, 1, 2, 1, 2) and job.layout.data_parallel == 2


def test_smp_v1_schedule_names_and_the_extension():
    assert ModelParallelParameters().schedule == "1f1b"  # SMP v1's default `pipeline: interleaved`
    assert ModelParallelParameters(pipeline="simple").schedule == "gpipe"
    assert ModelParallelParameters(pipeline_schedule="interleaved_1f1b").schedule == "interleaved_1f1b"


@pytest.mark.parametrize("world,degree", [(6, 4), (2, 4)])
def test_degree_must_divide_the_world(runtime_dir, world, degree):
    data = local_job(runtime_dir, world, {"pipeline_parallel_degree": degree, "microbatches": 4}, num_layers=4)
    (issue,) = only_issue(data, f"{MP}.pipeline_parallel_degree")
    assert issue.value == degree and f"world size {world}" in issue.problem


def test_per_stage_degrees_divide_world_over_pp(runtime_dir):
    found = only_issue(local_job(runtime_dir, 4, {"tensor_parallel_degree": 4}), f"{MP}.tensor_parallel_degree")
    assert any("must divide world / pipeline_parallel_degree = 2" in i.problem and "[1, 2]" in i.fix for i in found)


def test_stages_must_divide_the_layers(runtime_dir):
    (issue,) = only_issue(local_job(runtime_dir, 4, {"pipeline_parallel_degree": 4, "microbatches": 4}),
                          f"{MP}.pipeline_parallel_degree")
    assert "4 stages" in issue.problem and "2 layers" in issue.problem and "[1, 2]" in issue.fix
    params = {"pipeline_schedule": "interleaved_1f1b", "pipeline_virtual_stages": 2}
    assert only_issue(local_job(runtime_dir, 2, params), f"{MP}.pipeline_parallel_degree")
    assert not paths(local_job(runtime_dir, 2, params, num_layers=4))


@pytest.mark.parametrize("params,hp,key,words", [
    ({"microbatches": 1}, {}, "microbatches", "fewer than the 2 pipeline stages"),
    ({"microbatches": 3}, {}, "microbatches", "divide each data-parallel rank's batch of 4"),
    ({"microbatches": 3}, {"gradient_accumulation_steps": 3}, None, None),  # 4 x 3 sequences: fine
    ({"microbatches": 5, "pipeline_schedule": "interleaved_1f1b", "pipeline_virtual_stages": 2},
     {"num_layers": 4, "train_batch_size": 5}, "microbatches", "not a multiple of its 2 rounds"),
    ({"pipeline_schedule": "interleaved_1f1b"}, {}, "pipeline_virtual_stages", "set pipeline_virtual_stages >= 2"),
    ({"pipeline_virtual_stages": 2}, {"num_layers": 4}, "pipeline_virtual_stages", "one stage per rank"),
    ({"pipeline": "simple", "pipeline_schedule": "1f1b"}, {}, "pipeline_schedule", "contradicts SMP v1's"),
    ({"pipeline_parallel_degree": 1, "pipeline_schedule": "gpipe"}, {}, "pipeline_schedule", "means nothing"),
    ({"partitions": 1}, {}, "partitions", "pipeline_parallel_degree, which says 2"),
    ({"partitions": 2}, {}, None, None),
])
def test_microbatches_and_schedules(runtime_dir, params, hp, key, words):
    data = local_job(runtime_dir, 2, params, **hp)
    if key is None:
        assert not paths(data)
        return
    (issue,) = only_issue(data, f"{MP}.{key}")
    assert words in f"{issue.problem} {issue.fix}"


@pytest.mark.parametrize("hp,key", [
    ({"fp8": 1, "bf16": 1, "fp8_emulate": 1}, "fp8"),
    ({"delayed_param": 1}, "delayed_param"),
    ({"validation_freq": 2}, "validation_freq"),
])
def test_what_is_not_pipelined_yet_is_refused(runtime_dir, hp, key):
    assert only_issue(local_job(runtime_dir, 2, **hp), f"{HP}.{key}")


def test_tied_embeddings_are_refused(runtime_dir):
    data = local_job(runtime_dir, 2)
    data["hyperparameters"].update(model_preset="llama3.2-1b", max_context_width=64)
    assert any("ties its output layer" in i.problem for i in only_issue(data, f"{MP}.pipeline_parallel_degree"))


def test_a_user_script_pipelines_by_its_own_rules(user_script_dir):
    data = local_job(user_script_dir, 2, {"microbatches": 1})
    data["framework_version"], data["py_version"] = "2.4.1", "py311"
    assert f"{MP}.microbatches" not in paths(data)


def test_container_refuses_with_the_clients_check():
    # a job built by hand: the runtime's check is launcher.wire.training.layout's, in the same words
    from container.distributed.pipeline import check_pipeline
    from launcher.wire.training.hyperparameters import TrainingHyperparameters

    params = ModelParallelParameters(pipeline_parallel_degree=2, microbatches=3)
    rt = SimpleNamespace(params=params)
    s = run_settings(TrainingHyperparameters(train_batch_size=4), params, 2)
    with pytest.raises(ValueError, match=r"mp_parameters microbatches 3: must divide each data-parallel rank's "
                                         r"batch of 4 sequences .*\(use one of \[1, 2, 4\]\).*"
                                         r"mp_parameters pipeline_parallel_degree 2: x pipeline_virtual_stages 1 "
                                         r"makes 2 stages, which do not divide the model's 3 layers"):
        check_pipeline(rt, replace(PRESETS["llama3-tiny"], num_layers=3), s, pretrained_weights=False)
    assert layout_problems(params, 3)[0].key == "pipeline_parallel_degree"  # what runtime._check_layout raises


def test_validate_shows_the_pipeline(runtime_dir, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(local_job(runtime_dir, 4, {"pipeline": "simple"})))
    result = CliRunner().invoke(main, ["validate", str(path), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    text = json.dumps(summary)
    assert "pp=2, dp_replicate=1, dp_shard=2, cp=1, tp=1" in text
    assert "2 stages (1 per rank), gpipe schedule, 2 microbatches" in text
    bad = CliRunner().invoke(main, ["validate", str(path), "--set",
                                    f"{MP}.microbatches=1"], catch_exceptions=False)
    assert bad.exit_code == 2 and "microbatches" in bad.output


def p4d_job(runtime_dir, **params):
    """Llama 3.1 8B from scratch on one p4d (8 GPUs), 4 sequences of 4096 per data-parallel rank."""
    return {
        "entry_point": "train.py", "source_dir": str(runtime_dir), "instance_type": "ml.p4d.24xlarge",
        "hyperparameters": {"model_preset": "llama3.1-8b", "bf16": 1, "max_context_width": 4096,
                            "train_batch_size": 4, "activation_checkpointing": 1},
        "distribution": {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
            "enabled": True, "parameters": params}}},
    }


@pytest.mark.parametrize("schedule,in_flight", [("gpipe", 4), ("1f1b", 2)])
def test_planner_sizes_one_stage(runtime_dir, schedule, in_flight):
    from launcher.plan import estimate_memory, estimate_throughput

    flat = validate_job(p4d_job(runtime_dir, hybrid_shard_degree=4))  # 2 replicas of an FSDP group of 4
    piped = validate_job(p4d_job(runtime_dir, hybrid_shard_degree=4, pipeline_parallel_degree=2,
                                 microbatches=4, pipeline_schedule=schedule))
    m0, m1 = estimate_memory(flat), estimate_memory(piped)
    # the same FSDP group of 4, and a stage holds half the model: half the parameter state
    for key in ("parameters", "optimizer", "gradients"):
        assert m1.gib(key) == pytest.approx(m0.gib(key) / 2)
    # full checkpointing keeps each layer's input, a·h/t bytes per token: 16 of 32 layers, for
    # `in_flight` microbatches of one sequence (4 sequences in 4 microbatches)
    spec = PRESETS["llama3.1-8b"]
    assert m1.gib("activations") * 2**30 == pytest.approx(16 * in_flight * 4096 * 2 * spec.hidden_size)
    assert m0.gib("activations") * 2**30 == pytest.approx(32 * 4 * 4096 * 2 * spec.hidden_size)
    # the schedule's bubble, (pp - 1) / (m + pp - 1) = 1/5, does no work
    t0, t1 = estimate_throughput(flat), estimate_throughput(piped)
    assert t0.bubble_s == 0 and t1.bubble_s / t1.step_s == pytest.approx(1 / 5)
    assert t1.bound_by == "compute"
