"""What the unit and integration tests of model_rules share (tests/{unit,integration}/test_model_rules.py)."""

from __future__ import annotations

import pytest

from launcher.config import validate_job
from tests.support.train_runs import ROOT


def job(hp: dict, script=None, **fields) -> dict:
    data = {"entry_point": "train.py", "source_dir": str(script or ROOT / "entrypoints"), "instance_type": "local",
            "processes_per_host": 2, "hyperparameters": {"max_context_width": 64, **hp}}
    data.update(fields)
    return data


@pytest.fixture
def own_script(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("import torch  # a training loop of the user's own\n")
    return tmp_path / "code"


def warnings(data) -> list[str]:
    return [str(w) for w in validate_job(data).warnings]
