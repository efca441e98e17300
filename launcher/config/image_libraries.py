"""Which of SageMaker's distributed-training libraries an AWS training image carries (docs/images.md).

- SMP v2 (`torch.sagemaker`): only the SMP v2 images (`smdistributed-modelparallel:<version>-gpu-...`),
  which also carry SMDDP (AWS's "Supported frameworks" tables for SMP v2 and SMDDP).
- SMP v1 (`smdistributed.modelparallel`, smdistributed-modelparallel 1.x): the PyTorch training DLCs
  for GPUs from PyTorch 1.6.0 to 2.0.0; v1.15.0 on 2.0.0 is its last release (AWS's archived SMP v1
  "Supported frameworks" table). The SDK launches it with `mpi`, on the DLC of framework_version.
- SMDDP (`smdistributed.dataparallel`): the PyTorch training DLCs for GPUs whose version the SDK
  runs smddp with (`images.SMDDP_VERSIONS`, sagemaker.fw_utils' list: 1.6 to 2.2.0).

None of them is in a CPU image, and the SDK's UNSUPPORTED_DLC_IMAGE_FOR_SM_PARALLELISM
(`images.SMDISTRIBUTED_INCOMPATIBLE_IMAGES`) has neither SMP v1 nor SMDDP.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config import images

SMP_V2 = "torch.sagemaker"
SMP_V1 = "smdistributed.modelparallel"
SMDDP = "smdistributed.dataparallel"
SMP_V1_TORCH = ("1.6.0", "2.0.0")  # the first and the last PyTorch DLC with SMP v1


@dataclass(frozen=True)
class Library:
    module: str  # what a script imports
    name: str
    where: str  # the images that carry it, in words


def _smddp_range() -> str:
    versions = sorted((v for v in images.SMDDP_VERSIONS if v.count(".") == 2), key=images.version_key)
    return f"{versions[0]} to {versions[-1]}"


LIBRARIES = {
    SMP_V2: Library(SMP_V2, "SMP v2", "AWS's SMP v2 image (SageMaker's PyTorch estimator with distribution "
                    "torch_distributed and smdistributed.modelparallel enabled)"),
    SMP_V1: Library(SMP_V1, "SMP v1", f"the PyTorch DLCs {SMP_V1_TORCH[0]} to {SMP_V1_TORCH[1]} for GPUs "
                    "(SMP v1: SageMaker's PyTorch estimator with smdistributed.modelparallel and mpi, "
                    "without torch_distributed)"),
    SMDDP: Library(SMDDP, "SMDDP", f"the PyTorch DLCs {_smddp_range()} for GPUs and AWS's SMP v2 images"),
}


def image_libraries(uri: str, torch: str | None) -> frozenset[str]:
    """The modules of LIBRARIES that the AWS image `uri` (PyTorch `torch` inside, as
    images.ImageChoice says) carries; none for an image that is not AWS's PyTorch DLC or SMP v2 image."""
    repository, _, tag = uri.rpartition("/")[2].partition(":")
    if repository == "smdistributed-modelparallel":
        return frozenset({SMP_V2, SMDDP})
    if repository != "pytorch-training" or "-gpu-" not in f"-{tag}-" or torch is None \
            or any(bad in tag for bad in images.SMDISTRIBUTED_INCOMPATIBLE_IMAGES):
        return frozenset()
    version = images.dlc_version(torch)
    found = set()
    first, last = (images.version_key(v) for v in SMP_V1_TORCH)
    if first <= images.version_key(version) <= last:
        found.add(SMP_V1)
    if version in {images.dlc_version(v) for v in images.SMDDP_VERSIONS}:
        found.add(SMDDP)
    return frozenset(found)
