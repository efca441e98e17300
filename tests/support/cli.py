"""What the unit and integration tests of cli share (tests/{unit,integration}/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_network(no_network):
    """Every test here runs with the network refused (conftest.py)."""
