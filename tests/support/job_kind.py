"""What the unit and integration tests of job_kind share (tests/{unit,integration}/test_job_kind.py)."""

from __future__ import annotations

import pytest

from tests.support.train_runs import ROOT


@pytest.fixture
def own(tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "train.py").write_text("import argparse  # the user's CIFAR loop\n")
    return tmp_path / "own"


def job(source_dir, hp=None, params=None, **fields) -> dict:
    data = {"entry_point": "train.py", "source_dir": str(source_dir), "instance_type": "ml.p5.48xlarge",
            "hyperparameters": {"model_preset": "llama3-tiny", "max_context_width": 256, "bf16": 1, **(hp or {})},
            "distribution": {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
                "enabled": True, "parameters": {"hybrid_shard_degree": 8, **(params or {})}}}}}
    if source_dir != ROOT / "entrypoints":
        # a user's SMP script names its image, as the SageMaker SDK requires; the runtime takes its default
        data.update(framework_version="2.4.1", py_version="py311")
    data.update(fields)
    return data


# pytorch.json (SDK v2): the 2.8.0 DLC, account 763104351884 in both regions used here.
DLC = "763104351884.dkr.ecr.{region}.amazonaws.com/pytorch-training:2.8.0-gpu-py312"
