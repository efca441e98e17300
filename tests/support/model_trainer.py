"""What the unit and integration tests of model_trainer share (tests/{unit,integration}/test_model_trainer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(tmp_path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    return tmp_path / "code"


def issues(err: pytest.ExceptionInfo) -> dict[str, object]:
    return {i.path: i for i in err.value.issues}
