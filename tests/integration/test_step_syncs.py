"""Host syncs per training step (bench/step_syncs.py counts `aten::_local_scalar_dense`, every
`.item()`, `float(t)` and `bool(t)`, step by step, in train.py's loop): a step that logs nothing reads
one value, the non-finite guard's flag; a logging step reads the loss and the gradient norm too."""

from __future__ import annotations

from tests.support.bench_runs import bench_json


def syncs(*args: str) -> dict:
    return bench_json("step_syncs.py", *args)


def test_a_step_that_logs_nothing_reads_one_value():
    # fused AdamW keeps its step counters on the device; foreach and for-loop read theirs from host
    # tensors, which wait for nothing (counted apart as device_reads, below)
    counted = syncs("--optimizer_implementation", "fused", "--max_steps", "5", "--logging_freq", "4")
    steps = counted["steps"]
    assert [steps[s]["logged"] for s in ("2", "3", "4")] == [False, False, True]
    assert steps["2"]["reads"] == steps["3"]["reads"] == 1  # the guard's finite flag
    assert steps["4"]["reads"] == 3  # control: the record's loss and gradient norm as well
    assert counted["sites"]["resilience/nonfinite.py:__call__"] == 5  # one a step


def test_for_loop_adamw_reads_only_host_step_counters_besides():
    steps = syncs("--optimizer_implementation", "for-loop", "--max_steps", "3", "--logging_freq", "4")["steps"]
    assert steps["2"]["device_reads"] == 1
    assert steps["2"]["reads"] > 1  # control: each parameter's step counter, on the host
