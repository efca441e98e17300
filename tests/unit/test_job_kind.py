"""Two kinds of job: smlaunch's runtime gets its own rules; a user's script gets the launcher's
rules only, and its hyperparameters pass through as written.
Here the tests that run in one process; those that start processes are tests/integration/test_job_kind.py."""

from __future__ import annotations

from launcher.config import ConfigError, validate_job
from launcher.wire.hyperparameters import encode
from tests.support.job_kind import job
from tests.support.train_runs import ROOT

HP = "hyperparameters"
MP = "distribution.smdistributed.modelparallel.parameters"
# Choices a user's CIFAR or SMP script may make that smlaunch's train.py does not have.
FOREIGN = {"optimizer": "sgd", "lr_decay_style": "step", "dataset_type": "imagefolder",
           "sharding_strategy": "FULL_SHARD", "activation_checkpointing_mode": "blocks", "cp_comm_type": "ring",
           "distributed_backend": "mpi", "attention_kernel": "flash_attention_2", "momentum": 0.9}


def errors(data) -> list[str]:
    try:
        validate_job(data)
    except ConfigError as exc:
        return [i.path for i in exc.issues]
    return []


def test_the_kind_comes_from_the_entry_point_not_its_name(own):
    assert validate_job(job(ROOT / "entrypoints")).kind.runtime
    mine = validate_job(job(own))
    assert not mine.kind.runtime and "does not import container.trainer" in str(mine.kind)
    on_s3 = validate_job(job("s3://bucket/code/sourcedir.tar.gz"))
    assert not on_s3.kind.runtime and "on S3" in str(on_s3.kind)


def test_a_user_script_keeps_its_own_choices(own):
    result = validate_job(job(own, FOREIGN))
    assert result.warnings == []
    assert encode(result.config.hyperparameters.raw()) == encode({"model_preset": "llama3-tiny",
                                                                  "max_context_width": 256, "bf16": 1, **FOREIGN})
    runtime = errors(job(ROOT / "entrypoints", FOREIGN))
    assert {f"{HP}.{k}" for k in FOREIGN if k != "momentum"} <= set(runtime)


def test_runtime_limits_do_not_apply_to_a_user_script(own):
    te_with_tp = {"hp": {"fp8": 1, "fp8_backend": "transformer_engine"}, "params": {"tensor_parallel_degree": 2,
                                                                                  "hybrid_shard_degree": 4}}
    assert errors(job(own, **te_with_tp)) == []
    assert f"{HP}.fp8_backend" in errors(job(ROOT / "entrypoints", **te_with_tp))
    fp16 = job(own, {"bf16": 0, "fp16": 1})
    assert not any("float16" in str(w) for w in validate_job(fp16).warnings)
    assert any("float16" in str(w) for w in validate_job(job(ROOT / "entrypoints", {"bf16": 0, "fp16": 1})).warnings)
    near_miss = {"optimzer": "adamw"}  # smlaunch's train.py would train without it: an error there
    assert validate_job(job(own, near_miss)).warnings == []
    assert f"{HP}.optimzer" in errors(job(ROOT / "entrypoints", near_miss))


def test_launcher_rules_apply_to_both(own, tmp_path):
    """The world's facts bind every program; FP8 hardware and the 2·cp sequence cut are the runtime's
    rules and SMP's (docs/own-scripts.md): errors for the runtime and a script that uses SMP v2, notes
    for a plain script of the user's own."""
    smp = tmp_path / "smp"
    smp.mkdir()
    (smp / "train.py").write_text("import torch.sagemaker as tsm\n")
    for source in (own, smp, ROOT / "entrypoints"):
        assert f"{MP}.context_parallel_degree" in errors(job(source, params={"context_parallel_degree": 3}))
    for source in (smp, ROOT / "entrypoints"):
        assert f"{HP}.fp8" in errors(job(source, {"fp8": 1}, instance_type="ml.p4d.24xlarge"))
        assert f"{HP}.max_context_width" in errors(job(source, {"max_context_width": 1000},
                                                       params={"context_parallel_degree": 8}))
    plain = validate_job(job(own, {"fp8": 1, "max_context_width": 1000}, instance_type="ml.p4d.24xlarge",
                             params={"context_parallel_degree": 8}))
    assert {f"{HP}.fp8", f"{HP}.max_context_width"} <= {n.path for n in plain.notes}


def test_the_image_follows_the_kind(own):
    """A user's SMP script keeps the SDK's SMP v2 image; smlaunch's runtime cannot run on it."""
    from launcher.config.images import job_image_choice

    script = validate_job(job(own))
    choice = job_image_choice(script.config, "ml.p5.48xlarge", "us-east-1", runtime=script.kind.runtime)
    assert choice.uri == \
        "658645717510.dkr.ecr.us-east-1.amazonaws.com/smdistributed-modelparallel:2.4.1-gpu-py311-cu121"
    assert choice.reason == "SMP v2 image for PyTorch 2.4.1 (model parallelism on, with torch_distributed)"
    assert errors(job(own, framework_version=None, py_version=None)) == ["framework_version"]
    assert errors(job(ROOT / "entrypoints", framework_version="2.4.1", py_version="py311")) == ["framework_version"]
