"""`profile_steps` through train.py (container/profiling.py): every rank writes a trace of exactly
the window's steps, each a named range, and a table of its ops; a run without it writes nothing."""

from __future__ import annotations

import gzip
import json

from tests.support.train_runs import run_train, series


def _step_ranges(trace_path) -> list[str]:
    events = json.loads(gzip.decompress(trace_path.read_bytes()))["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("smlaunch step ")})


def test_every_rank_profiles_the_window_and_nothing_else(tmp_path):
    records = run_train(tmp_path / "profiled", 2, max_steps=5, train_batch_size=2, profile_steps="3-4")
    assert series(records, "step") == [1, 2, 3, 4, 5]  # the run goes on past the window
    profile = tmp_path / "profiled" / "out" / "profile"
    for rank in (0, 1):
        assert _step_ranges(profile / f"rank-{rank}.trace.json.gz") == ["smlaunch step 3", "smlaunch step 4"]
        table = (profile / f"rank-{rank}.txt").read_text()
        assert table.startswith(f"rank {rank}, steps 3-4, ops by self_cpu_time_total")
        assert "aten::mm" in table  # the model's matmuls, forward and backward
    log = (tmp_path / "profiled" / "rank-logs" / "rank0.log").read_text()
    assert f"profile: steps 3-4 written to {profile}" in log
    plain = run_train(tmp_path / "plain", 2, max_steps=2, train_batch_size=2)  # the control
    assert plain and not (tmp_path / "plain" / "out" / "profile").exists()
