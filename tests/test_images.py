import pytest

from launcher.backends.images import ImageResolutionError, resolve_image_uri


def uri(**overrides) -> str:
    args = {
        "region": "us-west-2",
        "framework_version": "2.4.1",
        "py_version": "py311",
        "instance_type": "ml.p5.48xlarge",
        "smp": True,
    }
    return resolve_image_uri(**{**args, **overrides})


def error(**overrides) -> ImageResolutionError:
    with pytest.raises(ImageResolutionError) as err:
        uri(**overrides)
    return err.value


def test_seed_smp_image_on_p5() -> None:
    assert uri() == (
        "658645717510.dkr.ecr.us-west-2.amazonaws.com/"
        "smdistributed-modelparallel:2.4.1-gpu-py311-cu121"
    )


def test_seed_smp_image_on_p4d_with_minor_version_and_default_python() -> None:
    assert uri(framework_version="2.4", py_version=None, instance_type="ml.p4d.24xlarge") == (
        "658645717510.dkr.ecr.us-west-2.amazonaws.com/"
        "smdistributed-modelparallel:2.4.1-gpu-py311-cu121"
    )


@pytest.mark.parametrize(
    ("version", "tag"),
    [
        ("2.5.1", "2.5.1-gpu-py311-cu124"),
        ("2.3", "2.3.1-gpu-py311-cu121"),
        ("2.2", "2.2.0-gpu-py310-cu121"),
        ("2.1", "2.1.2-gpu-py310-cu121"),
        (None, "2.5.1-gpu-py311-cu124"),  # latest SMP v2
    ],
)
def test_smp_versions(version, tag) -> None:
    assert uri(framework_version=version, py_version=None).endswith(f":{tag}")


def test_smp_region_uses_the_region_in_the_host() -> None:
    assert uri(region="eu-west-1").startswith("658645717510.dkr.ecr.eu-west-1.amazonaws.com/")


def test_dlc_gpu_tag() -> None:
    got = uri(smp=False, framework_version="2.4", py_version=None, instance_type="ml.g5.xlarge")
    assert got == (
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/"
        "pytorch-training:2.4.0-gpu-py311-cu124-ubuntu22.04-sagemaker"
    )


def test_dlc_cpu_tag() -> None:
    assert uri(smp=False, framework_version="2.4.0", instance_type="ml.m5.xlarge") == (
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/"
        "pytorch-training:2.4.0-cpu-py311-ubuntu22.04-sagemaker"
    )


@pytest.mark.parametrize(
    ("version", "instance_type", "tag"),
    [
        (None, "ml.p5.48xlarge", "2.8.0-gpu-py312-cu128-ubuntu22.04-sagemaker"),
        ("2.0", "ml.g4dn.xlarge", "2.0.1-gpu-py310-cu118-ubuntu20.04-sagemaker"),
        ("2.3", "ml.c5.2xlarge", "2.3.0-cpu-py311-ubuntu20.04-sagemaker"),
        ("2.5", "ml.p4de.24xlarge", "2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"),
        ("2.6", "ml.g6e.xlarge", "2.6.0-gpu-py312-cu126-ubuntu22.04-sagemaker"),
        ("2.7", "ml.p5en.48xlarge", "2.7.1-gpu-py312-cu128-ubuntu22.04-sagemaker"),
    ],
)
def test_dlc_versions(version, instance_type, tag) -> None:
    got = uri(smp=False, framework_version=version, py_version=None, instance_type=instance_type)
    assert got.endswith(f"/pytorch-training:{tag}")


@pytest.mark.parametrize(
    ("region", "registry"),
    [
        ("af-south-1", "626614931356.dkr.ecr.af-south-1.amazonaws.com"),
        ("ap-northeast-3", "364406365360.dkr.ecr.ap-northeast-3.amazonaws.com"),
        ("cn-north-1", "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn"),
        ("us-gov-west-1", "442386744353.dkr.ecr.us-gov-west-1.amazonaws.com"),
    ],
)
def test_dlc_regional_accounts(region, registry) -> None:
    got = uri(smp=False, framework_version="2.4", region=region)
    assert got.startswith(f"{registry}/pytorch-training:")


def test_unknown_version_names_field_and_suggests() -> None:
    err = error(framework_version="2.4.2")
    assert err.field == "framework_version"
    assert err.value == "2.4.2"
    message = str(err)
    assert "framework_version '2.4.2'" in message
    assert "SMP v2" in message
    assert "supported: 2.1, 2.1.2," in message
    assert "did you mean '2.4.1'" in message


def test_unknown_dlc_version_lists_dlc_versions() -> None:
    err = error(smp=False, framework_version="2.9.0", py_version=None)
    assert err.field == "framework_version"
    assert "2.8.0" in str(err) and "did you mean" in str(err)


def test_wrong_python_names_field_and_the_right_one() -> None:
    err = error(py_version="py310")
    assert err.field == "py_version"
    assert "py_version 'py310'" in str(err)
    assert "did you mean 'py311'" in str(err)


def test_region_without_smp_images() -> None:
    err = error(region="cn-north-1")
    assert err.field == "region"
    assert "us-west-2" in str(err)


def test_region_typo_suggests() -> None:
    err = error(smp=False, framework_version="2.4", region="us-west-3")
    assert err.field == "region"
    assert "did you mean 'us-west-2'" in str(err) or "did you mean 'us-west-1'" in str(err)


def test_smp_needs_a_gpu() -> None:
    err = error(instance_type="ml.m5.xlarge")
    assert err.field == "instance_type"
    assert "GPU" in str(err)


@pytest.mark.parametrize(
    "instance_type", ["ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.inf2.xlarge"]
)
@pytest.mark.parametrize("smp", [True, False])
def test_neuron_instances_are_refused(instance_type, smp) -> None:
    err = error(instance_type=instance_type, smp=smp)
    assert err.field == "instance_type"
    assert "Neuron" in str(err)


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "local", "ml.p5"])
def test_malformed_instance_type(instance_type) -> None:
    assert error(instance_type=instance_type).field == "instance_type"


def test_is_a_value_error() -> None:
    assert isinstance(error(framework_version="9.9"), ValueError)

