"""What the unit and integration tests of context_parallel share (tests/{unit,integration}/test_context_parallel.py)."""

from __future__ import annotations

import importlib.util

TE = importlib.util.find_spec("transformer_engine") is not None
