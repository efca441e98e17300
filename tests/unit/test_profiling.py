"""container/profiling.py's window in one process: a run that stops inside it writes what it
recorded, a resumed attempt profiles the rest of it, and one past it profiles nothing
(through train.py on two ranks: tests/integration/test_profiling.py)."""

from __future__ import annotations

import torch

from container.profiling import StepProfiler


def _steps(profiler: StepProfiler, steps) -> None:
    for step in steps:
        profiler.before(step)
        torch.ones(8, 8) @ torch.ones(8, 8)
        profiler.after(step)


def test_a_run_stopped_inside_the_window_writes_what_it_recorded(tmp_path):
    profiler = StepProfiler("2-5", tmp_path, 0, torch.device("cpu"))
    _steps(profiler, (1, 2, 3))
    assert not (tmp_path / "profile").exists()  # the window is still open
    profiler.close()  # a SIGTERM stop after step 3
    assert (tmp_path / "profile" / "rank-0.txt").read_text().startswith("rank 0, steps 2-3, ")
    assert (tmp_path / "profile" / "rank-0.trace.json.gz").stat().st_size > 0


def test_a_resumed_attempt_profiles_the_rest_of_the_window_and_one_past_it_nothing(tmp_path):
    resumed = StepProfiler("2-5", tmp_path / "resumed", 3, torch.device("cpu"))
    _steps(resumed, (4, 5, 6))
    assert (tmp_path / "resumed" / "profile" / "rank-3.txt").read_text().startswith("rank 3, steps 4-5, ")
    late = StepProfiler("2-5", tmp_path / "late", 0, torch.device("cpu"))
    _steps(late, (6, 7))
    late.close()
    assert not (tmp_path / "late" / "profile").exists()
