"""Training image URIs: AWS Deep Learning Containers for PyTorch, and the SMP v2 images.

Sources, so the tables can be refreshed:

- Versions, Python versions, version aliases and ECR accounts per region: the SageMaker Python
  SDK 2.257.7, ``src/sagemaker/image_uri_config/pytorch.json`` (``training``) and
  ``pytorch-smp.json``. In ``pytorch-smp.json`` the later keys of ``versions`` are SMP library
  releases and ``version_aliases`` maps PyTorch versions onto them; the image tag carries the
  PyTorch version. The SMP CUDA suffix is the one ``sagemaker.image_uris.get_training_image_uri``
  picks (cu124 for PyTorch 2.5, cu121 for 2.1-2.4).
- CUDA and Ubuntu parts of the DLC tags: ``pytorch/training/buildspec-2-<minor>-sm.yml`` in
  github.com/aws/deep-learning-containers (the ``-sagemaker`` images).

The SDK itself emits the short DLC tag (``2.4.0-gpu-py311``); the full tag built here names the
same image family with its CUDA and OS spelled out, as AWS's release notes list it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

SMP_ACCOUNT = "658645717510"
SMP_REPOSITORY = "smdistributed-modelparallel"
DLC_REPOSITORY = "pytorch-training"

# PyTorch version -> (Python, CUDA, Ubuntu). Versions before 2.0 are left out: the training
# container needs PyTorch 2.
_DLC_BUILDS: dict[str, tuple[str, str, str]] = {
    "2.0.0": ("py310", "cu118", "20.04"),
    "2.0.1": ("py310", "cu118", "20.04"),
    "2.1.0": ("py310", "cu121", "20.04"),
    "2.2.0": ("py310", "cu121", "20.04"),
    "2.3.0": ("py311", "cu121", "20.04"),
    "2.4.0": ("py311", "cu124", "22.04"),
    "2.5.1": ("py311", "cu124", "22.04"),
    "2.6.0": ("py312", "cu126", "22.04"),
    "2.7.1": ("py312", "cu128", "22.04"),
    "2.8.0": ("py312", "cu128", "22.04"),
}

# PyTorch version -> (Python, CUDA); the comment names the pytorch-smp.json entry the SDK
# resolves it to. PyTorch 2.0.1 is left out: the SDK picks its CUDA suffix by instance type.
_SMP_BUILDS: dict[str, tuple[str, str]] = {
    "2.1.2": ("py310", "cu121"),  # entry 2.1.2
    "2.2.0": ("py310", "cu121"),  # entry 2.3.1 (SMP 2.3.1)
    "2.3.1": ("py311", "cu121"),  # entry 2.5.0 (SMP 2.5.0)
    "2.4.1": ("py311", "cu121"),  # entry 2.7.0 (SMP 2.7.0)
    "2.5.1": ("py311", "cu124"),  # entry 2.8.0 (SMP 2.8.0)
}

# The same accounts serve every PyTorch 2.4+ version in pytorch.json; the ISO partitions that
# older versions also list are left out (their ECR hostnames differ).
_DLC_ACCOUNTS: dict[str, str] = {
    "af-south-1": "626614931356", "ap-east-1": "871362719292", "ap-east-2": "975050140332",
    "ap-northeast-1": "763104351884", "ap-northeast-2": "763104351884",
    "ap-northeast-3": "364406365360", "ap-south-1": "763104351884",
    "ap-south-2": "772153158452", "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884", "ap-southeast-3": "907027046896",
    "ap-southeast-4": "457447274322", "ap-southeast-5": "550225433462",
    "ap-southeast-6": "633930458069", "ap-southeast-7": "590183813437",
    "ca-central-1": "763104351884", "ca-west-1": "204538143572",
    "cn-north-1": "727897471807", "cn-northwest-1": "727897471807",
    "eu-central-1": "763104351884", "eu-central-2": "380420809688",
    "eu-north-1": "763104351884", "eu-south-1": "692866216735", "eu-south-2": "503227376785",
    "eu-west-1": "763104351884", "eu-west-2": "763104351884", "eu-west-3": "763104351884",
    "il-central-1": "780543022126", "me-central-1": "914824155844",
    "me-south-1": "217643126080", "mx-central-1": "637423239942", "sa-east-1": "763104351884",
    "us-east-1": "763104351884", "us-east-2": "763104351884",
    "us-gov-east-1": "446045086412", "us-gov-west-1": "442386744353",
    "us-west-1": "763104351884", "us-west-2": "763104351884",
}  # fmt: skip

# pytorch-smp.json lists one account for every region it serves.
_SMP_REGIONS: frozenset[str] = frozenset({
    "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1", "ap-southeast-1",
    "ap-southeast-2", "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1", "eu-west-2",
    "eu-west-3", "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
})  # fmt: skip

_INSTANCE_TYPE = re.compile(r"ml\.([a-z]+)\d+[a-z0-9-]*\.[a-z0-9]+")
_GPU_FAMILIES = frozenset({"p", "g"})
_NEURON_FAMILIES = frozenset({"trn", "inf"})


class ImageResolutionError(ValueError):
    """No known image matches; ``field`` names the offending argument."""

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


def resolve_image_uri(
    *,
    region: str,
    framework_version: str | None,
    py_version: str | None,
    instance_type: str,
    smp: bool,
) -> str:
    """The training image for a PyTorch job; SMP v2's image when ``smp`` is set.

    ``framework_version`` may be "2.4" (the latest patch the table has) or "2.4.1"; None means
    the newest version. ``py_version`` None means the one the image ships.
    """
    gpu = _has_gpu(instance_type)
    if smp:
        if not gpu:
            raise ImageResolutionError(
                "instance_type",
                instance_type,
                f"instance_type '{instance_type}' has no GPU, and SMP v2 images run only on "
                "GPU instances: pick an ml.p* or ml.g* type, or turn SMP off",
            )
        version = _full_version(framework_version, _SMP_BUILDS, "SMP v2 image")
        py, cuda = _SMP_BUILDS[version]
        _check_py(py_version, py, version)
        account = _account(region, dict.fromkeys(_SMP_REGIONS, SMP_ACCOUNT), "SMP v2 images")
        tag = f"{version}-gpu-{py}-{cuda}"
        return f"{_registry(account, region)}/{SMP_REPOSITORY}:{tag}"

    version = _full_version(framework_version, _DLC_BUILDS, "PyTorch training DLC")
    py, cuda, ubuntu = _DLC_BUILDS[version]
    _check_py(py_version, py, version)
    account = _account(region, _DLC_ACCOUNTS, "PyTorch training DLCs")
    device = f"gpu-{py}-{cuda}" if gpu else f"cpu-{py}"
    tag = f"{version}-{device}-ubuntu{ubuntu}-sagemaker"
    return f"{_registry(account, region)}/{DLC_REPOSITORY}:{tag}"


def _has_gpu(instance_type: str) -> bool:
    match = _INSTANCE_TYPE.fullmatch(instance_type)
    if match is None:
        raise ImageResolutionError(
            "instance_type",
            instance_type,
            f"instance_type '{instance_type}' is not a SageMaker instance type: use the "
            "'ml.' form, e.g. 'ml.p5.48xlarge' or 'ml.m5.xlarge'",
        )
    family = match.group(1)
    if family in _NEURON_FAMILIES:
        raise ImageResolutionError(
            "instance_type",
            instance_type,
            f"instance_type '{instance_type}' is a Trainium/Inferentia (Neuron) instance, which "
            "the PyTorch DLC and SMP images do not support: pick a GPU (ml.p*, ml.g*) or CPU "
            "instance, or pass a Neuron image URI explicitly",
        )
    return family in _GPU_FAMILIES


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _full_version(requested: str | None, builds: Mapping[str, object], what: str) -> str:
    if requested is None:
        return max(builds, key=_version_key)
    if requested in builds:
        return requested
    # "2.4" means the latest 2.4.x, which is what the SDK's version_aliases encode.
    if re.fullmatch(r"\d+\.\d+", requested):
        patches = [v for v in builds if v.startswith(f"{requested}.")]
        if patches:
            return max(patches, key=_version_key)
    minors = {v.rsplit(".", 1)[0] for v in builds}
    supported = sorted(set(builds) | minors, key=_version_key)
    raise _unsupported("framework_version", requested, f"has no {what}", supported)


def _check_py(requested: str | None, available: str, version: str) -> None:
    if requested is not None and requested != available:
        raise _unsupported(
            "py_version", requested, f"is not built for PyTorch {version}", [available]
        )


def _account(region: str, accounts: Mapping[str, str], what: str) -> str:
    if region not in accounts:
        raise _unsupported("region", region, f"has no {what}", sorted(accounts))
    return accounts[region]


def _registry(account: str, region: str) -> str:
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{domain}"


def _unsupported(
    field: str, value: str, problem: str, supported: Iterable[str]
) -> ImageResolutionError:
    choices = list(supported)
    message = f"{field} '{value}' {problem}; supported: {', '.join(choices)}"
    close = difflib.get_close_matches(value, choices, n=3, cutoff=0.6)
    if close:
        message += f"; did you mean {' or '.join(repr(c) for c in close)}?"
    return ImageResolutionError(field, value, message)


def job_image(job, instance_type: str, region: str) -> str:
    """The image a SageMaker job runs on: its `image_uri`, else the SDK's resolution from
    framework_version, py_version and the instance (SMP v2's image when model parallelism is on).
    `job` is a JobConfig."""
    return job.image_uri or resolve_image_uri(
        region=region, framework_version=job.framework_version, py_version=job.py_version,
        instance_type=instance_type, smp=bool(job.distribution and job.distribution.modelparallel))
