"""Which image a job runs on, and why. Expected URIs are the SageMaker SDK 2.257.7's own answers
(image_uris.get_training_image_uri with the same arguments; tests/integration/test_images_sdk.py compares a
whole grid against the installed SDK); the runtime's torch minimum is pyproject.toml's."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.images import RUNTIME_MIN_TORCH, ImageResolutionError, resolve_image

ROOT = Path(__file__).resolve().parents[2]
SMP_V2 = {"torch_distributed": {"enabled": True},
          "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"hybrid_shard_degree": 8}}}}
SMP_V1 = {"mpi": {"enabled": True},
          "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"sharded_data_parallel_degree": 8}}}}
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}
TORCHRUN = {"torch_distributed": {"enabled": True}}
DLC_US_WEST_2 = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training"
SMP_US_WEST_2 = "658645717510.dkr.ecr.us-west-2.amazonaws.com/smdistributed-modelparallel"


def choose(**overrides):
    args = {"region": "us-west-2", "instance_type": "ml.p5.48xlarge", "framework_version": "2.4.1",
            "py_version": "py311", "distribution": SMP_V2}
    return resolve_image(**{**args, **overrides})


def error(**overrides) -> ImageResolutionError:
    with pytest.raises(ImageResolutionError) as err:
        choose(**overrides)
    return err.value


# --- the SDK's resolution --------------------------------------------------------------------------
def test_seed_smp_v2_image() -> None:
    image = choose()
    assert image.uri == f"{SMP_US_WEST_2}:2.4.1-gpu-py311-cu121"
    assert image.reason == "SMP v2 image for PyTorch 2.4.1 (model parallelism on, with torch_distributed)"
    assert image.torch == "2.4.1"


@pytest.mark.parametrize(("version", "instance_type", "tag"), [
    ("2.4.1", "ml.p4d.24xlarge", "2.4.1-gpu-py311-cu121"),
    ("2.5.1", "ml.p4d.24xlarge", "2.5.1-gpu-py311-cu124"),
    ("2.2.0", "ml.g5.48xlarge", "2.2.0-gpu-py310-cu121"),  # PyTorch 2.2.0 is the entry of SMP 2.3.1
    ("2.0.1", "ml.p4d.24xlarge", "2.0.1-gpu-py310-cu118"),
    ("2.0.1", "ml.p5.48xlarge", "2.0.1-gpu-py310-cu121"),
])
def test_smp_v2_cuda_suffix_as_the_sdk_picks_it(version, instance_type, tag) -> None:
    image = choose(framework_version=version, py_version=None, instance_type=instance_type)
    assert image.uri == f"{SMP_US_WEST_2}:{tag}"


def test_smp_release_numbers_name_their_pytorch() -> None:
    """pytorch-smp.json's later entries are SMP releases: 2.8.0 is SMP 2.8.0, built on PyTorch 2.5.1."""
    image = choose(framework_version="2.8.0")
    assert image.uri == f"{SMP_US_WEST_2}:2.8.0-gpu-py311-cu121"
    assert image.torch == "2.5.1" and "2.8.0 for PyTorch 2.5.1" in image.reason


def test_smp_v1_runs_the_plain_dlc() -> None:
    """The SDK on an SMP v1 job (1.13.1, model parallel + mpi) picks pytorch-training:1.13.1-gpu-py39
    (docs/images.md, "Which image")."""
    image = choose(framework_version="1.13.1", py_version="py39", instance_type="ml.p4d.24xlarge", distribution=SMP_V1,
                   region="us-east-1")
    assert image.uri == "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:1.13.1-gpu-py39"
    assert image.reason == "PyTorch DLC 1.13.1 (SMP v1: model parallelism without torch_distributed)"


def test_modelparallel_without_enabled_is_on_for_the_sdk() -> None:
    implicit = {"torch_distributed": {"enabled": False}, "smdistributed": {"modelparallel": {}}}
    assert choose(distribution=implicit).uri == f"{SMP_US_WEST_2}:2.4.1-gpu-py311-cu121"


def test_smddp_runs_the_dlc_of_a_version_the_sdk_lists() -> None:
    image = choose(framework_version="2.2.0", py_version="py310", instance_type="ml.p4d.24xlarge", distribution=SMDDP)
    assert image.uri == f"{DLC_US_WEST_2}:2.2.0-gpu-py310"
    assert image.reason.startswith("PyTorch DLC 2.2.0 (smddp")
    err = error(framework_version="2.4", distribution=SMDDP)
    assert err.field == "framework_version" and "smddp" in err.problem
    assert "2.2.0" in err.fix and "2.1.2" not in err.fix  # 2.1.2 is in the SDK's list but has no DLC


def test_torchrun_versions_are_the_sdks_list() -> None:
    err = error(framework_version="2.4", distribution=TORCHRUN)
    assert err.field == "framework_version" and "torch_distributed" in err.problem
    assert "2.8.0" in err.fix and "2.4.1" not in err.fix  # 2.4.1 exists only as an SMP image
    image = choose(framework_version="2.8.0", py_version="py312", distribution=TORCHRUN)
    assert image.uri == f"{DLC_US_WEST_2}:2.8.0-gpu-py312"


@pytest.mark.parametrize(("version", "py", "instance_type", "tag"), [
    ("2.4", None, "ml.g5.xlarge", "2.4-gpu-py311"),
    ("2.4.0", "py311", "ml.m5.xlarge", "2.4.0-cpu-py311"),
    ("2.8.0", None, "ml.p5.48xlarge", "2.8.0-gpu-py312"),
    ("1.13.1", "py39", "ml.p3.16xlarge", "1.13.1-gpu-py39"),
    ("1.8", "py36", "ml.c5.2xlarge", "1.8-cpu-py36"),
    ("1.6", "py3", "ml.p4d.24xlarge", "1.6-gpu-py3-cu110-ubuntu18.04-v3"),
    ("1.6.0", "py36", "ml.p4d.24xlarge", "1.6.0-gpu-py36-cu110-ubuntu18.04"),
    ("1.6.0", "py36", "ml.p3.16xlarge", "1.6.0-gpu-py36"),
])
def test_dlc_tags_are_the_sdks(version, py, instance_type, tag) -> None:
    image = choose(framework_version=version, py_version=py, instance_type=instance_type, distribution=None)
    assert image.uri == f"{DLC_US_WEST_2}:{tag}"
    assert image.reason == f"PyTorch DLC {image.torch} (framework_version {version})"


def test_old_dlcs_live_in_the_old_repository() -> None:
    image = choose(framework_version="1.0", py_version="py3", instance_type="ml.p3.2xlarge", distribution=None)
    assert image.uri == "520713654638.dkr.ecr.us-west-2.amazonaws.com/sagemaker-pytorch:1.0-gpu-py3"


@pytest.mark.parametrize(("region", "registry"), [
    ("af-south-1", "626614931356.dkr.ecr.af-south-1.amazonaws.com"),
    ("cn-north-1", "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn"),
    ("us-gov-west-1", "442386744353.dkr.ecr.us-gov-west-1.amazonaws.com"),
    ("us-iso-east-1", "886529160074.dkr.ecr.us-iso-east-1.c2s.ic.gov"),
])
def test_dlc_regional_registries(region, registry) -> None:
    image = choose(framework_version="1.13.1", py_version="py39", distribution=None, region=region)
    assert image.uri.startswith(f"{registry}/pytorch-training:")


def test_p2_is_refused_from_pytorch_1_13() -> None:
    assert error(framework_version="1.13.1", py_version="py39", distribution=None, instance_type="ml.p2.xlarge").field \
        == "instance_type"
    assert choose(framework_version="1.12", py_version="py38", distribution=None, instance_type="ml.p2.xlarge").uri \
        == f"{DLC_US_WEST_2}:1.12-gpu-py38"


# --- errors name the field, the value and the choices -------------------------------------------------
def test_unknown_smp_version_lists_and_suggests() -> None:
    err = error(framework_version="2.4.2")
    assert (err.field, err.value) == ("framework_version", "2.4.2")
    assert "torch_distributed" in err.problem  # the SDK's first check: its list of torchrun versions
    assert err.fix.startswith("supported: 2.0.1, 2.1.2, 2.2.0,") and "did you mean '2.4.1'" in err.fix
    err = error(framework_version="2.6.0", py_version="py312")  # torchrun takes it, SMP v2 has no image
    assert "has no SMP v2 image" in err.problem and "2.5.1" in err.fix


def test_unknown_dlc_version_lists_dlc_versions() -> None:
    err = error(framework_version="2.9.0", py_version=None, distribution=None)
    assert err.field == "framework_version" and "2.8.0" in err.fix and "did you mean" in err.fix


def test_wrong_python_names_the_right_one() -> None:
    err = error(py_version="py310")
    assert err.field == "py_version" and "did you mean 'py311'" in err.fix


def test_python_is_needed_where_a_version_has_two() -> None:
    err = error(framework_version="1.8", py_version=None, distribution=None)
    assert err.field == "py_version" and "py3, py36" in err.fix


def test_region_without_smp_images() -> None:
    err = error(region="cn-north-1")
    assert err.field == "region" and "us-west-2" in err.fix


def test_region_typo_suggests() -> None:
    err = error(framework_version="2.4", distribution=None, region="us-west-3")
    assert err.field == "region" and ("did you mean 'us-west-2'" in err.fix or "did you mean 'us-west-1'" in err.fix)


def test_smp_needs_a_gpu() -> None:
    err = error(instance_type="ml.m5.xlarge")
    assert err.field == "instance_type" and "GPU" in err.problem


@pytest.mark.parametrize("instance_type", ["ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.inf2.xlarge", "ml.c6g.xlarge"])
@pytest.mark.parametrize("distribution", [SMP_V2, None])
def test_neuron_and_graviton_instances_are_refused(instance_type, distribution) -> None:
    assert error(instance_type=instance_type, distribution=distribution).field == "instance_type"


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "local", "ml.p5"])
def test_malformed_instance_type(instance_type) -> None:
    assert error(instance_type=instance_type).field == "instance_type"


def test_the_sdk_refuses_this_dlc_for_smdistributed_without_torchrun() -> None:
    uri = f"{DLC_US_WEST_2}:2.0.1-gpu-py310-cu121"
    assert error(image_uri=uri, distribution=SMDDP).field == "image_uri"
    assert choose(image_uri=uri, distribution={**SMDDP, **TORCHRUN}).uri == uri


def test_is_a_value_error() -> None:
    assert isinstance(error(framework_version="9.9"), ValueError)


# --- user scripts and smlaunch's runtime ---------------------------------------------------------------
def test_the_runtimes_minimum_is_pyprojects() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    assert f"torch>={RUNTIME_MIN_TORCH}" in train


def test_user_scripts_need_framework_version_or_image_uri_as_in_the_sdk() -> None:
    err = error(framework_version=None, py_version=None, runtime=False)
    assert err.field == "framework_version" and "image_uri" in err.fix
    assert choose(runtime=False).uri == f"{SMP_US_WEST_2}:2.4.1-gpu-py311-cu121"  # any version the SDK has
    assert choose(framework_version=None, image_uri="my/image:1", runtime=False).uri == "my/image:1"


@pytest.mark.parametrize("distribution", [None, SMP_V2, SMDDP])
def test_runtime_default_is_the_newest_dlc(distribution) -> None:
    image = choose(framework_version=None, py_version=None, distribution=distribution, runtime=True)
    assert image.uri == f"{DLC_US_WEST_2}:2.8.0-gpu-py312"
    assert image.reason == "PyTorch DLC 2.8.0: the default for smlaunch's runtime (needs torch >= 2.6)"
    assert choose(framework_version=None, py_version=None, instance_type="ml.m5.xlarge", runtime=True).uri \
        == f"{DLC_US_WEST_2}:2.8.0-cpu-py312"


def test_runtime_refuses_smp_v2_images() -> None:
    """Every SMP v2 image carries PyTorch <= 2.5.1 (docs/images.md): the runtime needs fully_shard (2.6)."""
    for version in ("2.4.1", "2.5.1", "2.8.0"):
        err = error(framework_version=version, runtime=True)
        assert (err.field, err.value) == ("framework_version", version)
        assert "torch >= 2.6" in err.problem and "remove framework_version and py_version" in err.fix


def test_runtime_refuses_old_dlcs_and_accepts_new_ones() -> None:
    err = error(framework_version="2.5.1", distribution=None, runtime=True)
    assert err.field == "framework_version" and "use framework_version 2.8.0 (py_version py312)" in err.fix
    assert choose(framework_version="2.6", py_version=None, distribution=None, runtime=True).uri \
        == f"{DLC_US_WEST_2}:2.6-gpu-py312"


@pytest.mark.parametrize(("image_uri", "ok"), [
    (f"{DLC_US_WEST_2}:2.4.0-gpu-py311", False),
    (f"{DLC_US_WEST_2}:2.5-gpu-py311-cu124-ubuntu22.04-sagemaker", False),
    (f"{SMP_US_WEST_2}:2.4.1-gpu-py311-cu121", False),
    (f"{DLC_US_WEST_2}:2.7.1-gpu-py312", True),
    ("111122223333.dkr.ecr.us-west-2.amazonaws.com/my-trainer:2.4.0", True),  # not an AWS image: unknown torch
])
def test_runtime_reads_torch_from_an_aws_image_uri(image_uri, ok) -> None:
    if ok:
        assert choose(image_uri=image_uri, runtime=True).uri == image_uri
    else:
        err = error(image_uri=image_uri, runtime=True)
        assert err.field == "image_uri" and "2.8.0-gpu-py312" in err.fix
