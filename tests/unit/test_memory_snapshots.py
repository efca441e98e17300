"""`memory_snapshot_steps` (container/memory_snapshots.py) with CUDA's two calls replaced: the
recording starts at the window's first step and its snapshot is written at its last, a CUDA OOM
inside it writes what was recorded, a stop writes it too, a resumed attempt records the rest of the
window; without CUDA nothing is recorded and rank 0 says so. Validate's side: the window's rules
and the warning where the instance has no CUDA GPU. (On a GPU: bench/gpu/trainpy.py's runs.)"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from container.memory_snapshots import MAX_ENTRIES, MemorySnapshots
from tests.support.config_checks import issues_of, only_issue, paths
from tests.unit.test_config_rules import make_job

CUDA = torch.device("cuda")  # a device object only: nothing is allocated on it


@pytest.fixture
def allocator(monkeypatch):
    """CUDA's history calls replaced: each recording's events are the steps it saw, and a dump writes
    them as JSON where the real one writes its pickle."""
    state = {"recording": None, "calls": []}

    def record(enabled="all", context="all", stacks="all", max_entries=None, **_):
        state["calls"].append(("record", enabled, stacks, max_entries))
        state["recording"] = [] if enabled else None

    def dump(filename):
        state["calls"].append(("dump", filename))
        with open(filename, "w") as f:
            json.dump(state["recording"], f)

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    return state


def _steps(snapshots: MemorySnapshots, allocator, steps) -> None:
    for step in steps:
        snapshots.before(step)
        if allocator["recording"] is not None:
            allocator["recording"].append(step)
        snapshots.after(step)


def test_the_window_is_recorded_from_its_first_step_and_written_at_its_last(tmp_path, allocator):
    snapshots = MemorySnapshots("3-4", tmp_path, 2, CUDA)
    _steps(snapshots, allocator, range(1, 7))
    written = tmp_path / "memory" / "rank-2-steps-3-4.pickle"
    assert json.loads(written.read_text()) == [3, 4]  # steps 3 and 4, no other
    assert allocator["calls"] == [("record", "all", "python", MAX_ENTRIES), ("dump", str(written)),
                                  ("record", None, "all", None)]  # and the recording stopped after it
    snapshots.close()  # the end of the run: nothing more to write
    assert [p.name for p in (tmp_path / "memory").iterdir()] == [written.name]


def test_an_out_of_memory_error_inside_the_window_writes_what_was_recorded(tmp_path, allocator):
    snapshots = MemorySnapshots("2-5", tmp_path, 0, CUDA)
    _steps(snapshots, allocator, (1, 2, 3))
    snapshots.before(4)
    allocator["recording"].append(4)
    snapshots.out_of_memory(4)  # the loop's except torch.OutOfMemoryError, before it raises again
    assert json.loads((tmp_path / "memory" / "rank-0-oom-step-4.pickle").read_text()) == [2, 3, 4]
    snapshots.close()
    assert len(list((tmp_path / "memory").iterdir())) == 1  # written once
    outside = MemorySnapshots("2-5", tmp_path / "outside", 0, CUDA)
    outside.out_of_memory(1)  # the control: no recording before the window, no file
    assert not (tmp_path / "outside").exists()


def test_a_stop_inside_the_window_writes_it_and_a_resumed_attempt_records_the_rest(tmp_path, allocator):
    stopped = MemorySnapshots("2-5", tmp_path / "a", 0, CUDA)
    _steps(stopped, allocator, (1, 2, 3))
    stopped.close()  # SIGTERM after step 3
    assert json.loads((tmp_path / "a" / "memory" / "rank-0-steps-2-stopped.pickle").read_text()) == [2, 3]
    resumed = MemorySnapshots("2-5", tmp_path / "b", 0, CUDA)
    _steps(resumed, allocator, (4, 5, 6))
    assert json.loads((tmp_path / "b" / "memory" / "rank-0-steps-4-5.pickle").read_text()) == [4, 5]
    late = MemorySnapshots("2-5", tmp_path / "c", 0, CUDA)
    _steps(late, allocator, (6, 7))
    late.close()
    assert not (tmp_path / "c").exists()


def test_without_cuda_nothing_is_recorded_and_rank_0_says_so(tmp_path, allocator, caplog):
    with caplog.at_level(logging.WARNING, logger="smlaunch"):
        for rank in (0, 1):
            snapshots = MemorySnapshots("1-2", tmp_path, rank, torch.device("cpu"))
            _steps(snapshots, allocator, (1, 2))
            snapshots.out_of_memory(2)
            snapshots.close()
    assert allocator["calls"] == [] and not (tmp_path / "memory").exists()
    said = [r.getMessage() for r in caplog.records if "memory_snapshot_steps" in r.getMessage()]
    assert len(said) == 1 and "no CUDA device" in said[0]  # rank 0 only
    assert MemorySnapshots(None, tmp_path, 0, CUDA).window is None  # off by default, on any device


def test_validate_checks_the_window_and_warns_where_there_is_no_cuda_gpu(runtime_dir):
    p4d = make_job(runtime_dir, hp={"max_steps": 20, "memory_snapshot_steps": "5-6"})
    assert paths(p4d) == []  # the control: an NVIDIA instance, a window the run has
    assert paths(make_job(runtime_dir, hp={"max_steps": 20, "memory_snapshot_steps": 5})) == []  # one step
    issue = only_issue(make_job(runtime_dir, hp={"max_steps": 20, "memory_snapshot_steps": "18-25"}),
                       "hyperparameters.memory_snapshot_steps")[0]
    assert "max_steps = 20" in issue.problem and "memory_snapshot_steps: 18-20" in issue.fix
    issue = only_issue(make_job(runtime_dir, hp={"memory_snapshot_steps": "7-5"}),
                       "hyperparameters.memory_snapshot_steps")[0]
    assert "FIRST-LAST" in issue.problem
    for instance_type, has in (("ml.trn1.32xlarge", "AWS Trainium"), ("ml.c5.18xlarge", "no GPU")):
        warned = only_issue(make_job(runtime_dir, hp={"max_steps": 20, "memory_snapshot_steps": "5-6"},
                                     instance_type=instance_type, distribution=None),
                            "hyperparameters.memory_snapshot_steps", level="warning")[0]
        assert has in warned.problem and "no memory snapshot" in warned.problem and "NVIDIA" in warned.fix
    gpu = make_job(runtime_dir, hp={"max_steps": 20, "memory_snapshot_steps": "5-6"}, instance_type="local_gpu",
                   distribution=None)
    assert not [i for i in issues_of(gpu, "warning") if "memory_snapshot" in i.path]  # found at run time
