"""Which of SageMaker's distributed libraries each AWS image carries (issue 38, item 2). The expected
sets are AWS's "Supported frameworks" tables, written out here by hand: SMP v1 in the PyTorch GPU
DLCs 1.6.0 to 2.0.0 (v1.15.0 on 1.13.1 and 2.0.0 its last), SMDDP in the GPU DLCs of the SDK's smddp
list (1.6 to 2.2.0) and in the SMP v2 images, SMP v2 (`torch.sagemaker`) in the SMP v2 images only."""

from __future__ import annotations

import pytest

from launcher.config.image_libraries import SMDDP, SMP_V1, SMP_V2, image_libraries
from launcher.config.images import resolve_image

V1_MPI = {"mpi": {"enabled": True, "processes_per_host": 8},
          "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"sharded_data_parallel_degree": 2}}}}
V2 = {"torch_distributed": {"enabled": True},
      "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"hybrid_shard_degree": 8}}}}


def carried(version: str, py: str, instance: str = "ml.p4d.24xlarge", dist=None) -> frozenset[str]:
    choice = resolve_image(region="us-east-1", instance_type=instance, framework_version=version, py_version=py,
                           distribution=V1_MPI if dist is None else dist)
    return image_libraries(choice.uri, choice.torch)


@pytest.mark.parametrize(("version", "py", "expected"), [
    ("1.13.1", "py39", {SMP_V1, SMDDP}),  # the seed's sharded data parallelism (MiCS) jobs
    ("1.6.0", "py3", {SMP_V1, SMDDP}),  # the first
    ("2.0.0", "py310", {SMP_V1, SMDDP}),  # SMP v1's last
    ("2.0.1", "py310", {SMDDP}),  # after SMP v1
    ("2.0", "py310", {SMDDP}),  # the SDK's alias of 2.0.1
    ("2.2.0", "py310", {SMDDP}),  # smddp's last DLC
    ("2.3.0", "py311", set()),
    ("2.8.0", "py312", set()),
    ("1.5.0", "py3", set()),  # before both
])
def test_the_pytorch_dlcs_carry_smp_v1_and_smddp_by_version(version, py, expected):
    assert carried(version, py) == expected


def test_the_smp_v2_image_carries_torch_sagemaker_and_smddp_but_not_smp_v1():
    assert carried("2.4.1", "py311", dist=V2) == {SMP_V2, SMDDP}


def test_cpu_images_and_other_images_carry_none():
    assert carried("1.13.1", "py39", instance="ml.m5.24xlarge", dist={}) == frozenset()
    assert image_libraries("111122223333.dkr.ecr.us-east-1.amazonaws.com/mine:1.13.1-gpu-py39", "1.13.1") == set()
    # an image_uri of the DLC repository is read by its tag, as the SDK's choice is
    dlc = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training"
    assert image_libraries(f"{dlc}:1.13.1-gpu-py39-cu117-ubuntu20.04-sagemaker", "1.13.1") == {SMP_V1, SMDDP}
    # the DLC the SDK refuses for smdistributed (UNSUPPORTED_DLC_IMAGE_FOR_SM_PARALLELISM)
    assert image_libraries(f"{dlc}:2.0.1-gpu-py310-cu121-ubuntu20.04-sagemaker", "2.0.1") == set()
