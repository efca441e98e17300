"""A user's own script is judged by its own rules (issue 30, items 2 and 3): its imports are read
from its files and checked against where it will run (AWS's SMP v2 library `torch.sagemaker` only
in the SMP v2 image); smlaunch's runtime rules (model shapes for tensor parallelism, precision
meanings) are notes for it, except the rules SMP documents for a script that uses SMP; validate
says which torch the job gets. AWS's own SMP v2 notebook job (llama_v2 7B, vocab 50257,
tensor_parallel_degree 2) is the worked case."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import ConfigError, validate_job
from launcher.config.script_imports import script_imports

HP = "hyperparameters"
MP = "distribution.smdistributed.modelparallel.parameters"
SMP_SCRIPT = """
import functools
import torch
import torch.sagemaker as tsm
from torch.sagemaker.distributed.fsdp import checkpoint  # noqa
import transformers
from train_lib import main
"""
LIB = """
import math, os
from . import helpers  # a relative import in the script's own package is its own
try:
    import wandb  # optional: the script runs without it
except ImportError:
    wandb = None
import datasets
"""
# AWS's notebook (smp-train-llama-fsdp-tp-cp): Llama 2 7B shapes with GPT-NeoX's 50257 tokens, tp 2
AWS_HP = {"model_type": "llama_v2", "hidden_width": 4096, "num_layers": 32, "num_heads": 32,
          "llama_intermediate_size": 11008, "vocab_size": 50257, "max_context_width": 4096, "bf16": 1,
          "train_batch_size": 2}


# the same job on the plain PyTorch DLC: torch_distributed without SMP
DLC = {"distribution": {"torch_distributed": {"enabled": True}}, "framework_version": "2.8.0", "py_version": "py312"}


def write_script(root: Path, script: str = SMP_SCRIPT, requirements: str | None = "transformers\ndatasets\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(script)
    (root / "train_lib.py").write_text(LIB)
    (root / "helpers.py").write_text("import numpy\n")
    if requirements is not None:
        (root / "requirements.txt").write_text(requirements)
    return root


def aws_job(source_dir: Path, hp=None, **fields) -> dict:
    data = {"entry_point": "train.py", "source_dir": str(source_dir), "instance_type": "ml.p4d.24xlarge",
            "instance_count": 1, "framework_version": "2.4.1", "py_version": "py311",
            "role": "arn:aws:iam::111122223333:role/x",
            "hyperparameters": {**AWS_HP, **(hp or {})},
            "distribution": {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
                "enabled": True, "parameters": {"hybrid_shard_degree": 4, "tensor_parallel_degree": 2}}}}}
    data.update(fields)
    return data


def errors(data) -> dict[str, str]:
    """Every error's problem by its path (several at one path joined with ' | ')."""
    try:
        validate_job(data)
    except ConfigError as exc:
        found: dict[str, str] = {}
        for i in exc.issues:
            found[i.path] = f"{found[i.path]} | {i.problem}" if i.path in found else i.problem
        return found
    return {}


def test_the_imports_are_read_from_the_scripts_files(tmp_path):
    found = {i.module: i for i in script_imports(write_script(tmp_path / "src") / "train.py")}
    assert {"torch", "torch.sagemaker", "transformers", "wandb", "datasets", "numpy"} <= set(found)
    assert not {"functools", "math", "os", "train_lib", "helpers"} & set(found)  # stdlib and the script's own
    assert found["wandb"].optional and not found["datasets"].optional
    assert found["torch.sagemaker"].where == "train.py:4" and found["datasets"].where == "train_lib.py:8"


def test_awss_smp_notebook_job_validates_on_the_smp_image(tmp_path):
    """The vocabulary of 50257 entries is smlaunch's runtime's rule, not SMP's (SMP pads it)."""
    job = validate_job(aws_job(write_script(tmp_path / "src")))
    assert job.smp_script and not job.kind.runtime
    assert not any("vocabulary" in i.problem for i in job.warnings)


def test_torch_sagemaker_where_it_cannot_exist_is_an_error_saying_where_it_does(tmp_path):
    src = write_script(tmp_path / "src")
    plain_dlc = aws_job(src, **DLC)
    found = errors(plain_dlc)
    assert "exists only in AWS's SMP v2 image" in found["entry_point"] and "the PyTorch DLC" in found["entry_point"]
    local = errors(aws_job(src, instance_type="local", distribution={"torch_distributed": {"enabled": True}}))
    assert "this job runs on this machine's Python (the local process runner)" in local["entry_point"]
    # the control: imported where it exists, or optionally, it is no error
    optional = write_script(tmp_path / "opt", SMP_SCRIPT.replace(
        "import torch.sagemaker as tsm", "try:\n    import torch.sagemaker as tsm\nexcept ImportError:\n    tsm = None"
    ).replace("from torch.sagemaker.distributed.fsdp import checkpoint  # noqa\n", ""))
    assert "entry_point" not in errors(aws_job(optional, **DLC))


@pytest.mark.parametrize(("fields", "target"), [
    ({"backend": "slurm"}, "the cluster's Python (Slurm)"),
    ({"local_runner": "docker"}, "smlaunch's training image (the local docker runner's default)")])
def test_each_backend_says_what_runs_the_script(tmp_path, fields, target):
    """The target is the backend's own (its row's target column)."""
    local = aws_job(write_script(tmp_path / "src"), instance_type="local",
                    distribution={"torch_distributed": {"enabled": True}}, **fields)
    assert f"this job runs on {target}" in errors(local)["entry_point"]


def test_a_module_the_target_lacks_and_requirements_do_not_list_is_a_warning(tmp_path):
    script = "import torch\nimport transformers\nimport definitely_not_installed_pkg\n"
    job = validate_job(aws_job(write_script(tmp_path / "src", script, requirements="transformers\n"), **DLC))
    warned = [i for i in job.warnings if i.path == "entry_point"]
    assert len(warned) == 1 and "imports definitely_not_installed_pkg" in warned[0].problem
    listed = write_script(tmp_path / "listed", script, requirements="transformers\ndefinitely-not-installed-pkg>=1\n")
    assert not [i for i in validate_job(aws_job(listed, **DLC)).warnings if i.path == "entry_point"]


@pytest.mark.parametrize("layout", ["-e ./pkg", "./pkg", "-e ./pkg (src layout)", "pyproject name",
                                    "./wheels/mine_pkg-1.0-py3-none-any.whl"])
def test_a_local_package_requirements_install_is_listed(tmp_path, layout):
    """Issue 49: `-e ./pkg` in requirements.txt, whose package the script imports, was warned about as
    "not listed in requirements.txt". A local package's modules are its files' (or its archive's name);
    a module no local package provides is still warned about (the control)."""
    script = "import torch\nimport mine_pkg\nimport definitely_not_installed_pkg\n"
    src = write_script(tmp_path / "src", script, requirements=None)
    line = layout.split(" (")[0] if layout != "pyproject name" else "-e ./pkg"
    (src / "requirements.txt").write_text(f"{line}\n")
    if layout.endswith(".whl"):
        (src / "wheels").mkdir()
        (src / "wheels" / "mine_pkg-1.0-py3-none-any.whl").write_bytes(b"")
    elif layout == "pyproject name":  # a project of modules whose names say nothing: its name does
        (src / "pkg").mkdir()
        (src / "pkg" / "pyproject.toml").write_text('[tool.x]\nname = "other"\n[project]\nname = "mine-pkg"\n')
    else:
        package = src / "pkg" / ("src" if "src layout" in layout else "") / "mine_pkg"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (src / "pkg" / "setup.py").write_text("from setuptools import setup\nsetup(name='x')\n")
    warned = [i.problem for i in validate_job(aws_job(src, **DLC)).warnings if i.path == "entry_point"]
    assert len(warned) == 1 and "imports definitely_not_installed_pkg" in warned[0]


def test_smlaunchs_rules_are_notes_for_a_plain_script_and_smps_stay_errors_for_an_smp_script(tmp_path):
    ddp = write_script(tmp_path / "ddp", "import torch\nimport torch.distributed as dist\n", requirements=None)
    # FP8 on an A100: the seed's mistake stays an error where SMP's FP8 is asked for
    assert "no FP8" in errors(aws_job(write_script(tmp_path / "smp"), hp={"fp8": 1}))[f"{HP}.fp8"]
    job = validate_job(aws_job(ddp, hp={"fp8": 1}, **DLC))
    [note] = [i for i in job.notes if i.path == f"{HP}.fp8"]
    assert "no FP8" in note.problem and "your script decides by its own" in note.problem
    # 30 heads do not split over tp 4: SMP's rule for an SMP script, a note for a plain one
    params = {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": {"hybrid_shard_degree": 2, "tensor_parallel_degree": 4}}}}
    assert "30 attention heads" in errors(aws_job(write_script(tmp_path / "smp2"), hp={"num_heads": 30},
                                                  distribution=params))[f"{MP}.tensor_parallel_degree"]
    plain = validate_job(aws_job(ddp, hp={"num_heads": 30}, **{**DLC, "distribution": {
        **params, "smdistributed": {"modelparallel": {"enabled": False, "parameters": {}}}}}))
    assert not plain.smp_script


def test_validate_says_which_torch_a_local_job_gets(tmp_path):
    from click.testing import CliRunner

    from launcher.cli.app import main

    src = write_script(tmp_path / "src", "import torch\n", requirements=None)
    (tmp_path / "job.yaml").write_text(
        f"entry_point: train.py\nsource_dir: {src}\ninstance_type: local\ninstance_count: 1\n"
        "framework_version: '2.4.1'\nhyperparameters: {epochs: 1}\n")
    out = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml")], catch_exceptions=False).output
    import torch

    assert f"torch                {torch.__version__} (this machine's Python (the local process runner); " \
           "framework_version 2.4.1 names a SageMaker image, which this job does not run)" in out
    assert "mesh" not in out  # a plain script's layout is its own


@pytest.mark.parametrize("script", ["import smdistributed.modelparallel.torch as smp\n",
                                    "from torch.sagemaker import state\n"])
def test_both_spellings_of_smp_make_an_smp_script(tmp_path, script):
    """SMP v1 on the DLC that carries it (the seed's MiCS job below), SMP v2 on its own image."""
    job_of = mics_job if script.startswith("import smdistributed") else aws_job
    job = validate_job(job_of(write_script(tmp_path / "src", script, requirements=None)))
    assert job.smp_script


# The seed's sharded data parallelism (MiCS) job: an SMP v1 script launched by mpi on the 1.13.1 DLC
# (issue 38, item 2). SMP v1 ships in that DLC; which image carries which library:
# tests/unit/test_image_libraries.py.
SMP_V1_SCRIPT = "import torch\nimport smdistributed.modelparallel.torch as smp\n"
SMP_V2_SCRIPT = "import torch\nimport torch.sagemaker as tsm\n"


def mics_job(source_dir: Path, **fields) -> dict:
    data = {"entry_point": "train.py", "source_dir": str(source_dir), "instance_type": "ml.p3.16xlarge",
            "instance_count": 1, "framework_version": "1.13.1", "py_version": "py39",
            "role": "arn:aws:iam::111122223333:role/x",
            "distribution": {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "ddp": True, "sharded_data_parallel_degree": 2}}}, "mpi": {"enabled": True, "processes_per_host": 8}}}
    data.update(fields)
    return data


@pytest.mark.parametrize("instance_type", ["ml.p3.16xlarge", "ml.p4d.24xlarge"])
def test_the_seeds_smp_v1_sharded_data_parallel_job_validates_on_its_dlc(tmp_path, instance_type):
    job = validate_job(mics_job(write_script(tmp_path / "src", SMP_V1_SCRIPT, requirements=None),
                                instance_type=instance_type))
    assert job.smp_script and not job.kind.runtime
    assert not [i for i in job.warnings if i.path == "entry_point"]


def test_each_smp_library_is_refused_where_the_image_lacks_it(tmp_path):
    v1 = write_script(tmp_path / "v1", SMP_V1_SCRIPT, requirements=None)
    v2 = write_script(tmp_path / "v2", SMP_V2_SCRIPT, requirements=None)
    # SMP v2 on the 1.13.1 DLC
    found = errors(mics_job(v2))["entry_point"]
    assert "imports torch.sagemaker, which exists only in AWS's SMP v2 image" in found
    assert "pytorch-training:1.13.1-gpu-py39" in found
    # SMP v1 on the SMP v2 image, on a 2.x DLC after SMP v1 ("2.0" is 2.0.1), and on a CPU DLC
    where_v1 = ("imports smdistributed.modelparallel.torch, which exists only in the PyTorch DLCs 1.6.0 to 2.0.0 "
                "for GPUs")
    on_smp_v2 = errors(aws_job(v1))["entry_point"]
    assert where_v1 in on_smp_v2 and "this job runs on the SMP v2 image" in on_smp_v2
    for fields in ({"framework_version": "2.8.0", "py_version": "py312"},
                   {"framework_version": "2.0", "py_version": "py310"},
                   {"instance_type": "ml.m5.24xlarge"}):
        assert where_v1 in errors(mics_job(v1, **fields)).get("entry_point", ""), fields
    # the controls: SMP v1's last DLC has it; SMDDP is in the 1.13.1 DLC and in the SMP v2 image
    assert "entry_point" not in errors(mics_job(v1, framework_version="2.0.0", py_version="py310"))
    smddp = write_script(tmp_path / "smddp", "import smdistributed.dataparallel.torch.torch_smddp\n", requirements=None)
    assert "entry_point" not in errors(mics_job(smddp))
    assert "entry_point" not in errors(aws_job(smddp))
    assert "exists only in the PyTorch DLCs 1.6.0 to 2.2.0" in errors(aws_job(smddp, **DLC))["entry_point"]


def test_bf16_on_a_v100_names_the_field_that_asked_for_it(tmp_path):
    """SMP v1 jobs ask for bf16 in the parameters (the seed's example); V100s have none."""
    src = write_script(tmp_path / "src", SMP_V1_SCRIPT, requirements=None)
    params = {"ddp": True, "sharded_data_parallel_degree": 2, "bf16": True}
    dist = {**mics_job(src)["distribution"], "smdistributed": {"modelparallel": {"enabled": True,
                                                                                "parameters": params}}}
    found = errors(mics_job(src, distribution=dist))
    assert "has no bfloat16 support" in found[f"{MP}.bf16"] and f"{HP}.bf16" not in found
    assert "has no bfloat16 support" in errors(mics_job(src, hyperparameters={"bf16": 1}))[f"{HP}.bf16"]
    assert not errors(mics_job(src, distribution=dist, instance_type="ml.p4d.24xlarge"))  # the control: an A100


@pytest.mark.parametrize("instance_type", ["ml.p3.16xlarge", "ml.p4d.24xlarge"])
def test_the_seeds_mics_job_file_validates(instance_type):
    from click.testing import CliRunner

    from launcher.cli.app import main

    job = Path(__file__).resolve().parents[2] / "configs" / "seed" / "mics-sdp2.yaml"
    result = CliRunner().invoke(main, ["validate", str(job), "--set", f"instance_type={instance_type}"])
    assert result.exit_code == 0, result.output
    assert "pytorch-training:1.13.1-gpu-py39" in result.output and "sharding_group       2" in result.output
    # the control: the same file on the SMP v2 image is refused for its SMP v1 import
    sets = ["framework_version=2.4.1", "py_version=py311", "instance_type=ml.p4d.24xlarge",
            "distribution.mpi.enabled=false", "distribution.torch_distributed.enabled=true"]
    v2 = CliRunner().invoke(main, ["validate", str(job), *(arg for s in sets for arg in ("--set", s))])
    assert v2.exit_code == 2 and "imports smdistributed.modelparallel.torch, which exists only in" in v2.stderr
