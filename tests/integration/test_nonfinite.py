"""Non-finite steps through train.py (nonfinite_policy; docs/faults.md): the injected fault makes a
step's loss and gradients NaN on one rank; skip, rollback, the bound and fail against real
references. The validation and the skip file's own tests: tests/unit/test_nonfinite.py.

References are runs of the same job over a data file without the rows of the step that was not
finite (JSON Lines, read in order: step s of a 2-rank run with train_batch_size 1 reads rows
2(s-1) and 2(s-1)+1), so their arithmetic is the runs' own, in the same layout and order: the
comparisons are exact. lr_decay_iters is fixed, so the schedule is the same whatever max_steps is.
"""

from __future__ import annotations

import json
import random

import pytest

from launcher.wire.faults import ATTEMPT_ENV, EXIT_NONFINITE_ROLLBACK, FAULT_DIR_ENV, FAULT_ENV, Fault, fault_spec
from launcher.wire.training.nonfinite import SkippedBatch, read_skips
from tests.support.train_runs import run_train, series

ROWS = 16
COMMON = {"dataset_type": "jsonl", "train_batch_size": 1, "lr_decay_iters": 6}


def _data(directory, leave_out=()):
    rng = random.Random(3)
    rows = [[rng.randrange(256) for _ in range(64)] for _ in range(ROWS)]  # TINY's max_context_width
    directory.mkdir(parents=True)
    (directory / "train.jsonl").write_text("".join(json.dumps({"input_ids": r}) + "\n"
                                                   for i, r in enumerate(rows) if i not in leave_out))
    return str(directory)


def _step_rows(step: int) -> tuple[int, int]:
    return 2 * (step - 1), 2 * (step - 1) + 1


def test_skip_applies_no_update_and_spends_the_batch(tmp_path, monkeypatch):
    data = _data(tmp_path / "data")
    plain = run_train(tmp_path / "plain", 2, **COMMON, training_dir=data)
    clean = run_train(tmp_path / "clean", 2, **COMMON, training_dir=data, nonfinite_policy="skip")
    # control: without a fault, skip trains exactly as the default
    assert series(clean, "loss") == series(plain, "loss") and series(clean, "grad_norm") == series(plain, "grad_norm")
    assert {r["nonfinite_steps"] for r in clean} == {0}

    monkeypatch.setenv(FAULT_ENV, fault_spec(Fault("nonfinite", rank=1, step=3)))
    skipped = run_train(tmp_path / "skipped", 2, **COMMON, training_dir=data, nonfinite_policy="skip")
    monkeypatch.delenv(FAULT_ENV)
    # the reference never sees step 3's rows, and makes one update fewer
    reference = run_train(tmp_path / "ref", 2, **COMMON, max_steps=5,
                          training_dir=_data(tmp_path / "ref-data", leave_out=_step_rows(3)))
    assert series(skipped, "step") == [1, 2, 3, 4, 5, 6]
    assert [r for r in skipped if r["step"] == 3] == [{"step": 3, "nonfinite_steps": 1}]  # no loss recorded
    assert [r["nonfinite_steps"] for r in skipped if "loss" in r] == [0, 0, 1, 1, 1]
    for key in ("loss", "grad_norm", "lr"):  # the schedule did not step either
        assert series(skipped, key) == series(reference, key), key
    log = (tmp_path / "skipped" / "rank-logs" / "rank0.log").read_text()
    assert "non-finite step 3 (loss is nan): skipped, no update" in log


def test_rollback_restarts_from_the_checkpoint_and_trains_past_the_batch(tmp_path, monkeypatch):
    data = _data(tmp_path / "data")
    hp = {**COMMON, "training_dir": data, "nonfinite_policy": "rollback", "checkpoint_freq": 3}
    run = tmp_path / "run"
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv(FAULT_DIR_ENV, str(faults))
    monkeypatch.setenv(FAULT_ENV, fault_spec(Fault("nonfinite", rank=1, step=5, attempt=0)))
    with pytest.raises(AssertionError, match=rf"exit {EXIT_NONFINITE_ROLLBACK}\)"):  # run_train's report
        run_train(run, 2, **hp)
    assert read_skips(run / "checkpoints") == [SkippedBatch(step=5, first_sample=8, samples=2, attempt=0,
                                                            loss="nan", grad_norm="nan")]
    record = json.loads((faults / "rank-1.json").read_text())
    assert record["exception"] == "NonFiniteRollback" and (record["step"], record["start_step"]) == (4, 0)
    first = [json.loads(line) for line in (run / "out" / "metrics.jsonl").read_text().splitlines()]
    assert series(first, "step") == [1, 2, 3, 4]

    monkeypatch.setenv(ATTEMPT_ENV, "1")  # the bootstrap's restart: the fault was attempt 0's
    records = run_train(run, 2, **hp)  # metrics.jsonl: both attempts' records
    reference = run_train(tmp_path / "ref", 2, **COMMON, training_dir=_data(tmp_path / "ref-data",
                                                                            leave_out=_step_rows(5)))
    resumed = records[len(first):]
    assert series(resumed, "step") == [4, 5, 6]  # from the checkpoint of step 3, step 4 again
    assert [r["nonfinite_steps"] for r in first] == [0] * 4 and [r["nonfinite_steps"] for r in resumed] == [1] * 3
    for key in ("loss", "grad_norm", "lr"):
        assert series(first, key) == series(reference, key)[:4], key
        assert series(resumed, key) == series(reference, key)[3:], key
    assert "training past the samples of non-finite step 5" in (run / "rank-logs" / "rank0.log").read_text()


def test_the_bound_counts_across_a_restart_and_names_the_steps(tmp_path, monkeypatch):
    """Skip, one rank: step 1 skipped, kept in the checkpoint of step 2; the restarted run from it
    meets step 4 and fails, one past nonfinite_max=1."""
    hp = {"nonfinite_policy": "skip", "nonfinite_max": 1, "checkpoint_freq": 2}
    monkeypatch.setenv(FAULT_ENV, fault_spec(Fault("nonfinite", rank=0, step=1, attempt=0),
                                             Fault("nonfinite", rank=0, step=4, attempt=1)))
    first = run_train(tmp_path, 1, max_steps=3, **hp)
    assert [r["nonfinite_steps"] for r in first] == [1, 1, 1]
    monkeypatch.setenv(ATTEMPT_ENV, "1")
    with pytest.raises(AssertionError) as failure:
        run_train(tmp_path, 1, max_steps=5, **hp)
    assert ("FloatingPointError: loss is nan at step 4: non-finite step 2 of this run, more than nonfinite_max=1 "
            "allows (non-finite steps: 1, 4)") in str(failure.value)


def test_fail_stops_at_the_step_before_its_update(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, fault_spec(Fault("nonfinite", rank=0, step=2)))
    with pytest.raises(AssertionError) as failure:
        run_train(tmp_path, 1, checkpoint_freq=1)
    assert "FloatingPointError: loss is nan at step 2: lower lr or check the data" in str(failure.value)
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert series(records, "step") == [1] and "nonfinite_steps" not in records[0]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]  # nothing after the fault
