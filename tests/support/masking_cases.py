"""What the unit and integration tests of secrets share (tests/{unit,integration}/test_secrets.py)."""

from __future__ import annotations

import stat
from pathlib import Path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
