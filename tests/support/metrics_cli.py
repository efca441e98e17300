"""What the unit and integration tests of metrics_cli share (tests/{unit,integration}/test_metrics_cli.py)."""

from __future__ import annotations

import json

from tests.support.local_jobs import HP

RUN_HP = {**HP, "max_steps": 6, "validation_freq": 3, "validation_batches": 1}


ONE_PROCESS = {"torch_distributed": {"enabled": True}}


def jsonl(home, name: str) -> list[dict]:  # noqa: F811 - home: fixture
    path = home / "jobs" / name / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
