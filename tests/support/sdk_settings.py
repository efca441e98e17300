"""What the unit and integration tests of sdk_settings share (tests/{unit,integration}/test_sdk_settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import validate_job
from launcher.wire.training.issues import ConfigError

ROLE = "arn:aws:iam::111122223333:role/R"


def job(tmp: Path, **changes) -> dict:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "cifar.py").write_text("print('hi')\n")
    args = {"entry_point": "cifar.py", "source_dir": str(code), "role": ROLE, "instance_type": "ml.g5.xlarge",
            "framework_version": "2.5.1", "py_version": "py311"}
    args.update(changes)
    return args


def issues_of(args: dict) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        validate_job(args)
    return {i.path: f"{i.problem}; {i.fix}" for i in err.value.issues}
