"""What the unit and integration tests of cli share (tests/{unit,integration}/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

