"""The training image against the official SageMaker SDK v2 (the `sagemaker` extra), offline.

For a grid of framework/Python versions, instance types, regions and distributions, smlaunch must
name exactly the image the SDK names, and refuse exactly what the SDK refuses. The SDK's side is
what its `PyTorch` estimator does with the same arguments: the version checks of
`fw_utils.validate_distribution`, then `image_uris.get_training_image_uri`.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from functools import cache
from pathlib import Path

import pytest

from launcher.config import images
from launcher.config.images import ImageResolutionError, resolve_image

# The SDK is found here and imported by the worker that runs these tests, not at every worker's
# collection (~1.4 CPU s each); its image tables (SDK_CONFIG) parametrize the tests.
_SDK = importlib.util.find_spec("sagemaker")
if _SDK is None:
    pytest.skip("the sagemaker extra (the SDK v2) is not installed", allow_module_level=True)
SDK_CONFIG = Path(_SDK.submodule_search_locations[0]) / "image_uri_config"
# its import's notice that v3 exists (the SDK v2 is the reference here)
pytestmark = pytest.mark.filterwarnings("ignore:You are using the SageMaker Python SDK v2")
INSTANCES = ["ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g5.xlarge", "ml.p3.16xlarge", "ml.p2.xlarge",
             "ml.m5.xlarge", "ml.c5.2xlarge"]
SMP_V2 = {"torch_distributed": {"enabled": True},
          "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"hybrid_shard_degree": 8}}}}
DISTRIBUTIONS = {
    "none": None,
    "torchrun": {"torch_distributed": {"enabled": True}},
    "smp-v2": SMP_V2,
    # the SDK's defaults: modelparallel without `enabled` is on; torch_distributed counts as a key
    "smp-v2-implicit": {"torch_distributed": {"enabled": False}, "smdistributed": {"modelparallel": {}}},
    "smp-v1": {"mpi": {"enabled": True, "processes_per_host": 8},
               "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                   "sharded_data_parallel_degree": 8, "ddp": True}}}},
    "smddp": {"smdistributed": {"dataparallel": {"enabled": True}}},
    "smddp-off": {"smdistributed": {"dataparallel": {"enabled": False}}},
}
REGIONS = ["us-east-1", "eu-west-1", "cn-north-1", "us-gov-west-1", "us-iso-east-1", "af-south-1", "ap-east-2"]


@cache
def _resolver():
    """retrieve() re-reads botocore's endpoints.json (35 ms) on every call; the answer never changes."""
    import sagemaker.utils

    return cache(sagemaker.utils._botocore_resolver)


@pytest.fixture(autouse=True)
def _cached_endpoints(monkeypatch):
    import sagemaker.utils

    monkeypatch.setattr(sagemaker.utils, "_botocore_resolver", _resolver())


def sdk(region: str, instance_type: str, version: str, py: str | None, dist: dict | None) -> str:
    """The SDK's image, or raises what it raises. A missing py_version takes retrieve's default
    (the estimator itself requires it; smlaunch does not when the version has one Python)."""
    from sagemaker import fw_utils, image_uris

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dist:
            fw_utils.validate_smdistributed(instance_type, "pytorch", version, py or "py3", dist, None)
            fw_utils.validate_torch_distributed_distribution(instance_type, dist, version, py or "py3", None,
                                                            "train.py")
        return image_uris.get_training_image_uri(region, "pytorch", framework_version=version, py_version=py,
                                                 distribution=dist, instance_type=instance_type)


def ours(region: str, instance_type: str, version: str, py: str | None, dist: dict | None) -> str:
    return resolve_image(region=region, instance_type=instance_type, framework_version=version,
                         py_version=py, distribution=dist).uri


def compare(region, instance_type, version, py, dist) -> str | None:
    """None when both name the same image or both refuse; else what differs."""
    try:
        expected = sdk(region, instance_type, version, py, dist)
    except (ValueError, TypeError) as exc:
        expected = f"SDK refuses: {str(exc)[:80]}"
    try:
        got = ours(region, instance_type, version, py, dist)
    except ImageResolutionError as exc:
        got = f"smlaunch refuses: {exc}"[:100]
    if expected == got or ("refuses" in expected and "refuses" in got):
        return None
    return f"{version} {py} {instance_type} {region} {dist}: SDK {expected!r}, smlaunch {got!r}"


def _versions(framework: str) -> list[str]:
    table = json.loads((SDK_CONFIG / f"{framework}.json").read_text())["training"]
    return sorted(set(table["versions"]) | set(table["version_aliases"]))


def _pythons(version: str) -> list[str | None]:
    found = set()
    for framework in ("pytorch", "pytorch-smp"):
        table = json.loads((SDK_CONFIG / f"{framework}.json").read_text())["training"]
        entry = table["versions"].get(table["version_aliases"].get(version, version))
        if entry:
            found |= set(entry["py_versions"])
    # py2 is refused by the job model (py_version: py3...), so it is not compared here
    return [None, "py312"] + sorted(p for p in found if p != "py2")


def test_the_table_is_the_sdks() -> None:
    table = json.loads(images.TABLE.read_text())
    assert table["pytorch"] == json.loads((SDK_CONFIG / "pytorch.json").read_text())["training"]
    assert table["pytorch-smp"] == json.loads((SDK_CONFIG / "pytorch-smp.json").read_text())["training"]


def test_the_sdk_constants_are_the_sdks() -> None:
    import sagemaker.estimator
    from sagemaker import fw_utils

    assert images.TORCH_DISTRIBUTED_GPU_VERSIONS == tuple(fw_utils.TORCH_DISTRIBUTED_GPU_SUPPORTED_FRAMEWORK_VERSIONS)
    assert images.SMDDP_VERSIONS == tuple(fw_utils.SM_DATAPARALLEL_SUPPORTED_FRAMEWORK_VERSIONS["pytorch"])
    framework = sagemaker.estimator.Framework
    assert images.SMDISTRIBUTED_INCOMPATIBLE_IMAGES == framework.UNSUPPORTED_DLC_IMAGE_FOR_SM_PARALLELISM
    assert images._GRAVITON == frozenset(fw_utils.GRAVITON_ALLOWED_TARGET_INSTANCE_FAMILY)


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_every_version_python_and_instance_as_the_sdk(name: str) -> None:
    dist = DISTRIBUTIONS[name]
    torchrun = bool(dist and dist.get("torch_distributed", {}).get("enabled"))
    differences, compared = [], 0
    for version in _versions("pytorch") + _versions("pytorch-smp"):
        for py in _pythons(version):
            for instance_type in INSTANCES:
                if torchrun and instance_type[3] not in "gp":
                    continue  # the SDK refuses torchrun off GPUs; rules.check_launchers says so
                compared += 1
                diff = compare("us-west-2", instance_type, version, py, dist)
                if diff:
                    differences.append(diff)
    assert compared > 500
    assert not differences, "\n".join(differences[:20]) + f"\n({len(differences)} of {compared} differ)"


@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize(("version", "py", "dist"), [
    ("1.13.1", "py39", DISTRIBUTIONS["smp-v1"]), ("2.1", "py310", None), ("2.8.0", "py312", None),
    ("2.4.1", "py311", SMP_V2), ("2.2.0", "py310", DISTRIBUTIONS["smddp"]), ("0.4", "py3", None),
])
def test_regions_as_the_sdk(region, version, py, dist) -> None:
    assert compare(region, "ml.p4d.24xlarge", version, py, dist) is None


def test_every_region_of_the_table_as_the_sdk() -> None:
    table = json.loads(images.TABLE.read_text())
    differences = []
    for framework, version, py in (("pytorch", "2.3.0", "py311"), ("pytorch", "1.8.1", "py36"),
                                   ("pytorch-smp", "2.5.1", "py311")):
        entry = table[framework]["versions"][table[framework]["version_aliases"].get(version, version)]
        for region in sorted(entry["registries"]):
            diff = compare(region, "ml.p5.48xlarge", version, py, SMP_V2 if framework == "pytorch-smp" else None)
            if diff:
                differences.append(diff)
    assert not differences, "\n".join(differences)


@pytest.mark.parametrize("instance_type", ["ml.trn1.32xlarge", "ml.inf2.xlarge", "ml.c6g.xlarge"])
def test_neuron_and_graviton_are_refused_where_the_sdk_switches_image_family(instance_type) -> None:
    """The SDK answers with Neuron or Graviton inference images (or refuses): not PyTorch DLCs."""
    with pytest.raises(ImageResolutionError) as err:
        ours("us-east-1", instance_type, "1.13.1", "py39", None)
    assert err.value.field == "instance_type"


@pytest.mark.parametrize(("version", "py", "instance_type", "dist", "expected"), [
    # docs/images.md: the SDK v2 on an SMP v1 job (1.13.1, model parallel + mpi) picks the plain DLC
    ("1.13.1", "py39", "ml.p4d.24xlarge", DISTRIBUTIONS["smp-v1"],
     "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:1.13.1-gpu-py39"),
    ("2.4.1", "py311", "ml.p5.48xlarge", SMP_V2,
     "658645717510.dkr.ecr.us-east-1.amazonaws.com/smdistributed-modelparallel:2.4.1-gpu-py311-cu121"),
    ("2.2.0", "py310", "ml.p4d.24xlarge", DISTRIBUTIONS["smddp"],
     "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.2.0-gpu-py310"),
    ("2.8.0", "py312", "ml.g5.xlarge", {"torch_distributed": {"enabled": True}},
     "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"),
])
def test_the_sdk_estimator_itself(fake_credentials, no_network, version, py, instance_type, dist, expected):
    """sagemaker.pytorch.PyTorch(...).training_image_uri(), built offline, names the same image."""
    import boto3
    import sagemaker
    from sagemaker.pytorch import PyTorch

    session = sagemaker.Session(boto_session=boto3.Session(region_name="us-east-1"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = PyTorch(entry_point="train.py", role="arn:aws:iam::111122223333:role/R",
                            instance_type=instance_type, instance_count=1, framework_version=version,
                            py_version=py, distribution=dist, sagemaker_session=session)
        assert estimator.training_image_uri() == expected
    assert ours("us-east-1", instance_type, version, py, dist) == expected
