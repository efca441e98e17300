"""`compile`, the in-process half (the training runs: tests/integration/test_compile.py): what
validation refuses by name, what it lets through, what the container refuses before it builds
anything, and what `validate` says."""

from __future__ import annotations

import pytest

from container.args import parse_args
from launcher.wire.training.run_settings import run_settings
from tests.support.config_checks import issues_of, only_issue, paths
from tests.unit.test_config_rules import make_job

COMPILE = {"compile": 1}
TE_FP8 = {"fp8": 1, "fp8_backend": "transformer_engine"}


def test_what_compile_composes_with_passes(runtime_dir):
    assert paths(make_job(runtime_dir, hp=COMPILE)) == []  # FSDP over 8
    assert paths(make_job(runtime_dir, hp={**COMPILE, "activation_checkpointing": 1,
                                           "activation_checkpointing_mode": "selective"},
                          params={"context_parallel_degree": 2, "hybrid_shard_degree": 4})) == []
    assert paths(make_job(runtime_dir, hp={**COMPILE, "fp8": 1, "fp8_backend": "torchao"},
                          instance_type="ml.p5.48xlarge")) == []
    # tensor parallelism too (container.distributed.compile works around torch 2.13's faults there)
    assert paths(make_job(runtime_dir, hp=COMPILE, params={"tensor_parallel_degree": 2,
                                                           "hybrid_shard_degree": 4})) == []


def test_transformer_engine_fp8_is_refused_by_name(runtime_dir):
    assert paths(make_job(runtime_dir, hp=TE_FP8, instance_type="ml.p5.48xlarge")) == []  # the control
    issue = only_issue(make_job(runtime_dir, hp={**TE_FP8, **COMPILE}, instance_type="ml.p5.48xlarge"),
                       "hyperparameters.fp8_backend")[0]
    assert "compile=1 with Transformer Engine's FP8 is not supported" in issue.problem
    assert "fp8_backend=torchao" in issue.fix


def test_a_user_script_reads_compile_as_it_likes(user_script_dir):
    job = make_job(user_script_dir, hp={**COMPILE, **TE_FP8}, instance_type="ml.p5.48xlarge",
                   image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1")
    assert not any("compile=1" in i.problem for i in issues_of(job))


def test_the_container_refuses_what_validation_refuses():
    from container.trainer import refuse_unimplemented

    argv = ["--model_preset", "llama3-tiny", "--compile", "1"]
    refuse_unimplemented(parse_args(argv)[0])  # the control: compile alone
    te = [a for key, value in TE_FP8.items() for a in (f"--{key}", str(value))]
    with pytest.raises(ValueError, match="compile=1 with Transformer Engine's FP8 is not supported"):
        refuse_unimplemented(parse_args(argv + te)[0])


@pytest.mark.parametrize(("value", "on"), [("1", True), ("0", False), ("True", True), (None, False)])
def test_the_hyperparameter_reaches_the_run_settings(value, on):
    argv = ["--model_preset", "llama3-tiny"] + (["--compile", value] if value is not None else [])
    assert run_settings(parse_args(argv)[0], None, 1).compile is on


def test_a_mixture_of_experts_model_is_refused_by_name(runtime_dir):
    moe = {"hf_pretrained_model_name_or_dir": None, "model_preset": "mixtral-tiny", "max_context_width": 64}
    assert "hyperparameters.compile" not in paths(make_job(runtime_dir, hp=moe))  # the control: eager MoE
    issue = only_issue(make_job(runtime_dir, hp={**moe, **COMPILE}), "hyperparameters.compile")[0]
    assert issue.problem.startswith("compile=1 with a mixture-of-experts model is not supported")
    assert paths(make_job(runtime_dir, hp={**COMPILE, "max_context_width": 64,
                                           "hf_pretrained_model_name_or_dir": None,
                                           "model_preset": "llama3-tiny"})) == []  # the control: dense


def test_the_container_refuses_a_mixture_of_experts_model_before_compiling():
    import torch._dynamo

    from container import loss
    from container.distributed.compile import apply_compile
    from container.models.llama import build_model
    from launcher.wire.training.models import PRESETS

    with pytest.raises(ValueError, match="compile=1 with a mixture-of-experts model is not supported"):
        apply_compile(build_model(PRESETS["mixtral-tiny"], 64, device="meta"))
    dense = build_model(PRESETS["llama3-tiny"], 64, device="meta")
    # the control: a dense model compiles (lazily: nothing is traced before the first call); the
    # process's loss and dynamo settings are put back for the tests after this one
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=False):
        try:
            apply_compile(dense)
        finally:
            loss.use_compiled(False)
    assert all(block._compiled_call_impl is not None for block in dense.layers.values())


def test_validate_says_whether_compile_is_on():
    from click.testing import CliRunner

    from launcher.cli.app import main
    from tests.support.cli import ROOT

    job = ROOT / "configs" / "seed" / "p4d-cp8.yaml"
    lines = {}
    for value in ("0", "1"):
        result = CliRunner().invoke(main, ["validate", str(job), "--set", f"hyperparameters.compile={value}"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        lines[value] = [line for line in result.stdout.splitlines() if line.strip().startswith("compile ")]
    assert [line.split(None, 1)[1] for line in lines["0"]] == ["off"]  # the control
    assert [line.split(None, 1)[1] for line in lines["1"]] == ["on: torch.compile of each transformer block and "
                                                               "the loss"]
    # tensor parallelism compiles (the job's degrees made to fit a world of 8 beside it)
    tp = CliRunner().invoke(main, ["validate", str(job), "--set", "hyperparameters.compile=1",
                                   "--set", "tensor_parallel_degree=2", "--set", "hybrid_shard_degree=4",
                                   "--set", "context_parallel_degree=4"])
    assert tp.exit_code == 0 and "on: torch.compile of each transformer block" in tp.stdout, tp.output
