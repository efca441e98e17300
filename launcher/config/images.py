"""Which training image a SageMaker job runs on, and why: the SageMaker Python SDK v2's choice.

Source: the SageMaker Python SDK 2.257.7.

- ``pytorch_images.json`` is a verbatim copy of the SDK's ``image_uri_config/pytorch.json``
  (scope ``training``: the PyTorch DLCs 0.4 to 2.8) under ``pytorch`` and of
  ``image_uri_config/pytorch-smp.json`` (``training``: the SMP v2 images) under ``pytorch-smp``.
  tests/integration/test_images_sdk.py fails when the installed SDK's files differ (refresh: see
  docs/images.md).
- The rules are those of ``sagemaker.image_uris.get_training_image_uri`` and ``retrieve``, and the
  version checks of the SDK's ``PyTorch`` estimator (``sagemaker.fw_utils.validate_distribution``);
  the constants below are the SDK's. tests/integration/test_images_sdk.py compares the URIs with the SDK's
  own over a grid of versions, Python versions, instance types, regions and distributions.

In the SDK's terms: a ``distribution`` holding both ``torch_distributed`` and
``smdistributed.modelparallel`` (whose ``enabled`` defaults to true) selects SMP v2's
``smdistributed-modelparallel`` image, its CUDA suffix read from framework_version. Everything
else, SMP v1 (model parallelism launched by mpi) and smddp (``smdistributed.dataparallel``)
included, runs the PyTorch DLC ``pytorch-training:<framework_version>-<cpu|gpu>-<py_version>``.
The tag carries framework_version as written: "2.4" gives the DLC's moving tag ``2.4-gpu-py311``.

smlaunch's own rules: Neuron (trn, inf) and Graviton instances are refused where the SDK would
switch to Neuron or inference images; py_version may be left out when the version has one Python
(``retrieve``'s rule; the SDK's estimator requires it); a job that runs smlaunch's runtime needs
torch >= RUNTIME_MIN_TORCH, and without framework_version and image_uri it runs on the newest DLC,
as if image_uri named it.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

# The oldest PyTorch smlaunch's runtime runs on: torch.distributed.fsdp.fully_shard is public from
# 2.6. pyproject.toml's `train` extra asks for the same (tests/unit/test_images.py holds them together).
RUNTIME_MIN_TORCH = "2.6"

TABLE = Path(__file__).with_name("pytorch_images.json")
DLC = "pytorch"
SMP = "pytorch-smp"

# sagemaker.fw_utils.TORCH_DISTRIBUTED_GPU_SUPPORTED_FRAMEWORK_VERSIONS
TORCH_DISTRIBUTED_GPU_VERSIONS = ("1.13.1", "2.0.0", "2.0.1", "2.1.0", "2.1.2", "2.2.0", "2.3.0", "2.3.1",
                                  "2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0")
# sagemaker.fw_utils.SM_DATAPARALLEL_SUPPORTED_FRAMEWORK_VERSIONS["pytorch"]
SMDDP_VERSIONS = ("1.6", "1.6.0", "1.7", "1.7.1", "1.8", "1.8.0", "1.8.1", "1.9", "1.9.0", "1.9.1", "1.10",
                  "1.10.0", "1.10.2", "1.11", "1.11.0", "1.12", "1.12.0", "1.12.1", "1.13.1", "2.0.0", "2.0.1",
                  "2.1.0", "2.1.2", "2.2.0")
# sagemaker.estimator.Framework.UNSUPPORTED_DLC_IMAGE_FOR_SM_PARALLELISM
SMDISTRIBUTED_INCOMPATIBLE_IMAGES = ("2.0.1-gpu-py310-cu121",)
# sagemaker.image_uris._get_image_tag: the suffix PyTorch 1.6 GPU tags get on p4d or with smdistributed.
_PT16_SUFFIXES = {"1.6-gpu-py36": "cu110-ubuntu18.04-v3", "1.6.0-gpu-py36": "cu110-ubuntu18.04",
                  "1.6-gpu-py3": "cu110-ubuntu18.04-v3", "1.6.0-gpu-py3": "cu110-ubuntu18.04"}
# sagemaker.fw_utils.GRAVITON_ALLOWED_TARGET_INSTANCE_FAMILY
_GRAVITON = frozenset({"m6g", "m6gd", "c6g", "c6gd", "c6gn", "c7g", "r6g", "r6gd"})
# ECR's DNS suffix outside the aws partition, as botocore resolves it for the SDK.
_PARTITION_DNS = (("cn-", "amazonaws.com.cn"), ("us-isob-", "sc2s.sgov.gov"), ("us-isof-", "csp.hci.ic.gov"),
                  ("us-iso-", "c2s.ic.gov"), ("eu-isoe-", "cloud.adc-e.uk"))
_INSTANCE_TYPE = re.compile(r"ml\.([a-z][a-z0-9-]*)\.[a-z0-9]+")
_ECR_REGION = re.compile(r"^\d{12}\.dkr\.ecr\.([a-z0-9-]+)\.")
_KNOWN_IMAGE = re.compile(r"/(pytorch-training|smdistributed-modelparallel):(\d+\.\d+(?:\.\d+)?)-")


@dataclass(frozen=True)
class ImageChoice:
    """The image, why it is the one, and the PyTorch version inside where the table or tag tells."""

    uri: str
    reason: str
    torch: str | None = None


class ImageResolutionError(ValueError):
    """No image fits, or the SDK refuses the combination; ``field`` names the offending argument."""

    def __init__(self, field: str, value: object, problem: str, fix: str) -> None:
        super().__init__(f"{field} {problem}; {fix}" if value is None else f"{field} '{value}' {problem}; {fix}")
        self.field, self.value, self.problem, self.fix = field, value, problem, fix


def resolve_image(
    *,
    region: str,
    instance_type: str,
    framework_version: str | None = None,
    py_version: str | None = None,
    distribution: Mapping[str, Any] | None = None,
    image_uri: str | None = None,
    runtime: bool | None = None,
) -> ImageChoice:
    """The training image for a PyTorch job, as the SDK picks it from the same arguments.

    ``distribution`` is the estimator's dict as the SDK sees it. ``runtime``: the job runs
    smlaunch's runtime (True: its torch minimum is checked), a script of the user's own (False:
    framework_version or image_uri is required, as in the SDK), or it is not known (None: a job
    already validated).
    """
    dist = dict(distribution or {})
    if image_uri:
        _check_image_with_launchers(image_uri, dist)
        torch = _torch_in_uri(image_uri)
        choice = ImageChoice(image_uri, f"image_uri as given (PyTorch {torch})" if torch else "image_uri as given",
                             torch)
        if runtime:
            _check_runtime(choice, "image_uri", image_uri, region, instance_type)
        return choice
    if framework_version is None:
        if runtime is False:
            newest = _newest(DLC)
            raise ImageResolutionError(
                "framework_version", None,
                "is required without image_uri: the SageMaker SDK picks the image from framework_version "
                "and py_version",
                f"set framework_version (e.g. {newest}, py_version {_py_versions(DLC, newest)[0]}) or image_uri")
        return runtime_default_image(region, instance_type, py_version)
    _check_versions_with_launchers(framework_version, instance_type, dist)
    choice = _retrieve(_framework(dist), region, framework_version, py_version, instance_type, dist)
    if runtime:
        _check_runtime(choice, "framework_version", framework_version, region, instance_type)
    return choice


def runtime_default_image(region: str, instance_type: str, py_version: str | None = None) -> ImageChoice:
    """The newest PyTorch DLC: smlaunch's runtime's image when a job names no version and no image."""
    version = _newest(DLC)
    choice = _retrieve(DLC, region, version, py_version, instance_type, {})
    return ImageChoice(choice.uri, f"PyTorch DLC {version}: the default for smlaunch's runtime "
                                   f"(needs torch >= {RUNTIME_MIN_TORCH})", choice.torch)


def job_image_choice(job, instance_type: str, region: str, *, runtime: bool | None = None) -> ImageChoice:
    """`resolve_image` for a JobConfig."""
    dist = job.distribution.model_dump(exclude_unset=True, exclude_none=True) if job.distribution else None
    return resolve_image(region=region, instance_type=instance_type, framework_version=job.framework_version,
                         py_version=job.py_version, distribution=dist, image_uri=job.image_uri, runtime=runtime)


def job_image(job, instance_type: str, region: str, *, runtime: bool | None = None) -> str:
    """The image URI a SageMaker job runs on (`job` is a JobConfig)."""
    return job_image_choice(job, instance_type, region, runtime=runtime).uri


# --- the SDK's resolution ---------------------------------------------------------------------------
@cache
def _table() -> dict[str, Any]:
    return json.loads(TABLE.read_text())


def _framework(dist: Mapping[str, Any]) -> str:
    """get_training_image_uri: SMP v2 needs both keys; modelparallel's `enabled` defaults to true."""
    mp = (dist.get("smdistributed") or {}).get("modelparallel")
    return SMP if "torch_distributed" in dist and mp is not None and mp.get("enabled", True) else DLC


def _retrieve(framework: str, region: str, version: str, py_version: str | None, instance_type: str,
              dist: Mapping[str, Any]) -> ImageChoice:
    table = _table()[framework]
    family, processor = _processor(instance_type, framework)
    config = table["versions"].get(table["version_aliases"].get(version, version))
    if config is None:
        what = "SMP v2 image (model parallelism with torch_distributed)" if framework == SMP else "PyTorch DLC"
        raise _unsupported("framework_version", version, f"has no {what}", _accepted(framework))
    py = _py(py_version, config["py_versions"], version)
    accounts = config["registries"]
    if region not in accounts:
        raise _unsupported("region", region, f"has no {_label(framework)} {version}", sorted(accounts))
    torch = _torch_of(framework, version)
    if framework == SMP:
        tag = f"{version}-{processor}-{py}-{_smp_cuda(version, instance_type)}"
        shown = f"for PyTorch {torch}" if torch == version else f"{version} for PyTorch {torch}"
        reason = f"SMP v2 image {shown} (model parallelism on, with torch_distributed)"
    else:
        if family == "p2" and version_key(version) >= (1, 13):
            raise ImageResolutionError("instance_type", instance_type,
                                       "is a P2 instance, which the SageMaker SDK refuses from PyTorch 1.13",
                                       "pick a newer GPU family (ml.g5, ml.p3 or later)")
        tag = f"{version}-{processor}-{py}"
        if processor == "gpu" and (family == "p4d" or "smdistributed" in dist) and tag in _PT16_SUFFIXES:
            tag += f"-{_PT16_SUFFIXES[tag]}"
        reason = f"PyTorch DLC {torch} ({_dlc_why(version, dist)})"
    uri = f"{accounts[region]}.dkr.ecr.{region}.{_dns(region)}/{config['repository']}:{tag}"
    return ImageChoice(uri, reason, torch)


def _dlc_why(version: str, dist: Mapping[str, Any]) -> str:
    smd = dist.get("smdistributed") or {}
    if (smd.get("dataparallel") or {}).get("enabled"):
        return "smddp: SageMaker's data-parallel library ships in the DLC"
    if smd.get("modelparallel") is not None and smd["modelparallel"].get("enabled", True):
        return "SMP v1: model parallelism without torch_distributed"
    return f"framework_version {version}"


def _processor(instance_type: str, framework: str) -> tuple[str, str]:
    match = _INSTANCE_TYPE.fullmatch(instance_type)
    if match is None:
        raise ImageResolutionError("instance_type", instance_type, "is not a SageMaker instance type",
                                   "use the 'ml.' form, e.g. 'ml.p5.48xlarge' or 'ml.m5.xlarge'")
    family = match.group(1)
    if family.startswith(("trn", "inf")):
        raise ImageResolutionError(
            "instance_type", instance_type,
            "is a Trainium/Inferentia (Neuron) instance; the PyTorch DLC and SMP images do not run there",
            "pick a GPU (ml.p*, ml.g*) or CPU instance, or pass a Neuron image as image_uri")
    if family in _GRAVITON:
        raise ImageResolutionError(
            "instance_type", instance_type, "is a Graviton (arm64) instance; PyTorch training DLCs are x86",
            "pick an x86 instance, or pass an arm64 image as image_uri")
    processor = "gpu" if family[0] in "gp" else "cpu"
    if processor not in _table()[framework]["processors"]:
        raise ImageResolutionError(
            "instance_type", instance_type, "has no GPU, and SMP v2 images run only on GPU instances",
            "pick an ml.p* or ml.g* type, or turn model parallelism off")
    return family, processor


def _smp_cuda(version: str, instance_type: str) -> str:
    """get_training_image_uri's choice, substring tests included."""
    if "2.5" in version:
        return "cu124"
    if "p5" in instance_type or any(v in version for v in ("2.1", "2.2", "2.3", "2.4")):
        return "cu121"
    return "cu118"


def _py(requested: str | None, available: list[str], version: str) -> str:
    if requested is None:
        if len(available) == 1:
            return available[0]
        raise ImageResolutionError("py_version", None, f"is required: PyTorch {version} images come for "
                                   f"{', '.join(available)}", f"set py_version to one of {', '.join(available)}")
    if requested not in available:
        raise _unsupported("py_version", requested, f"is not built for PyTorch {version}", available)
    return requested


def _dns(region: str) -> str:
    return next((dns for prefix, dns in _PARTITION_DNS if region.startswith(prefix)), "amazonaws.com")


def _label(framework: str) -> str:
    return "SMP v2 image" if framework == SMP else "PyTorch DLC"


def _accepted(framework: str) -> list[str]:
    table = _table()[framework]
    return sorted(set(table["versions"]) | set(table["version_aliases"]), key=version_key)


def _py_versions(framework: str, version: str) -> list[str]:
    table = _table()[framework]
    return table["versions"][table["version_aliases"].get(version, version)]["py_versions"]


def _newest(framework: str) -> str:
    return max(_table()[framework]["versions"], key=version_key)


@cache
def _smp_torch() -> dict[str, str]:
    """SMP table entry -> the PyTorch inside: the full PyTorch version aliased to it, else the entry
    itself (the first entries are named after PyTorch, the later ones after SMP releases)."""
    table = _table()[SMP]
    out = {entry: entry for entry in table["versions"]}
    for alias, entry in sorted(table["version_aliases"].items(), key=lambda kv: version_key(kv[0])):
        if alias.count(".") == 2:
            out[entry] = alias
    return out


def _torch_of(framework: str, version: str) -> str:
    table = _table()[framework]
    entry = table["version_aliases"].get(version, version)
    return _smp_torch()[entry] if framework == SMP else entry


def version_key(version: str) -> tuple[int, ...]:
    """A version's order: "1.13.1" -> (1, 13, 1)."""
    return tuple(int(part) for part in version.split("."))


def dlc_version(version: str) -> str:
    """The PyTorch DLC table's entry a version names: "2.0" is 2.0.1, as the SDK's aliases say."""
    return _table()[DLC]["version_aliases"].get(version, version)


# --- the SDK estimator's checks ---------------------------------------------------------------------
def _check_versions_with_launchers(version: str, instance_type: str, dist: Mapping[str, Any]) -> None:
    """validate_distribution's version checks (the SDK skips them when image_uri is given)."""
    framework = _framework(dist)
    if (dist.get("torch_distributed") or {}).get("enabled") and _is_gpu(instance_type) \
            and version not in TORCH_DISTRIBUTED_GPU_VERSIONS:
        usable = [v for v in TORCH_DISTRIBUTED_GPU_VERSIONS if v in _accepted(framework)]
        raise _unsupported("framework_version", version,
                           "is not a version the SageMaker SDK launches with torch_distributed on GPUs", usable)
    smd = dist.get("smdistributed") or {}
    if (smd.get("dataparallel") or {}).get("enabled") and version not in SMDDP_VERSIONS:
        usable = [v for v in SMDDP_VERSIONS if v in _accepted(framework)]
        raise _unsupported("framework_version", version,
                           "is not a version the SageMaker SDK runs smdistributed dataparallel (smddp) with",
                           usable)


def _check_image_with_launchers(image_uri: str, dist: Mapping[str, Any]) -> None:
    """Framework._distribution_configuration: this DLC has no SMP/smddp library for mpi launches."""
    torchrun = (dist.get("torch_distributed") or {}).get("enabled")
    bad = next((tag for tag in SMDISTRIBUTED_INCOMPATIBLE_IMAGES if tag in image_uri), None)
    if "smdistributed" in dist and not torchrun and bad:
        raise ImageResolutionError(
            "image_uri", image_uri, f"({bad}) cannot run smdistributed libraries without torch_distributed "
            "(the SageMaker SDK refuses it)", "add torch_distributed: {enabled: true}, or pick another image")


def _is_gpu(instance_type: str) -> bool:
    match = _INSTANCE_TYPE.fullmatch(instance_type)
    return bool(match and match.group(1)[0] in "gp")


_ECR_REPOSITORY = re.compile(r"^(\d{12})\.dkr\.ecr\.[a-z0-9-]+\.[a-z0-9.]+/([^:@]+)")


def is_aws_training_image(uri: str) -> bool:
    """Whether `uri` is one of AWS's own training images of the table (a PyTorch DLC or an SMP v2 image, in
    one of AWS's registries): images without smlaunch, which a SageMaker job's code archive brings."""
    match = _ECR_REPOSITORY.match(uri)
    return bool(match) and any(
        match.group(2) == version["repository"] and match.group(1) in version["registries"].values()
        for framework in (DLC, SMP) for version in _table()[framework]["versions"].values())


def ecr_region(uri: str) -> str | None:
    """The region of an ECR image URI; None for other registries."""
    match = _ECR_REGION.match(uri)
    return match.group(1) if match else None


# --- smlaunch's runtime -----------------------------------------------------------------------------
def _torch_in_uri(uri: str) -> str | None:
    """The PyTorch version an AWS PyTorch DLC or SMP v2 image's tag names; None for other images."""
    match = _KNOWN_IMAGE.search(uri)
    return match.group(2) if match else None


def _check_runtime(choice: ImageChoice, field: str, value: str, region: str, instance_type: str) -> None:
    if choice.torch is None or version_key(choice.torch) >= version_key(RUNTIME_MIN_TORCH):
        return
    default = runtime_default_image(region, instance_type)
    what = f"names an image with PyTorch {choice.torch}" if field == "image_uri" else f"gives the {choice.reason}"
    problem = (f"{what}; smlaunch's runtime needs torch >= {RUNTIME_MIN_TORCH} "
               "(torch.distributed.fsdp.fully_shard)")
    if field == "image_uri":
        fix = f"use an image with torch >= {RUNTIME_MIN_TORCH}, e.g. {default.uri}, or remove image_uri"
    elif _framework_of(choice) == SMP:
        fix = (f"remove framework_version and py_version: the runtime then runs on PyTorch DLC {default.torch} "
               "and applies the model-parallel parameters itself, without SMP's library; or set image_uri "
               f"to an image with torch >= {RUNTIME_MIN_TORCH}")
    else:
        fix = (f"use framework_version {default.torch} (py_version {_py_versions(DLC, default.torch)[0]}), "
               "or remove framework_version and py_version for that default")
    raise ImageResolutionError(field, value, problem, fix)


def _framework_of(choice: ImageChoice) -> str:
    return SMP if "/smdistributed-modelparallel:" in choice.uri else DLC


def _unsupported(field: str, value: str, problem: str, supported: Iterable[str]) -> ImageResolutionError:
    choices = list(supported)
    fix = f"supported: {', '.join(choices)}"
    close = difflib.get_close_matches(value, choices, n=3, cutoff=0.6)
    if close:
        fix += f"; did you mean {' or '.join(repr(c) for c in close)}?"
    return ImageResolutionError(field, value, problem, fix)
