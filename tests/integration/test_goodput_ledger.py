"""The time ledger through train.py (container/resilience/ledger.py): every metrics record of a real
run carries the attempt's cumulative seconds, they grow step by step and fit within the loop's
elapsed time, and a resumed attempt's records measure as the goodput model says
(launcher/wire/goodput.py; the arithmetic itself: tests/unit/test_goodput_measured.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from launcher.wire import goodput as gw
from launcher.wire.faults import ATTEMPT_ENV, FAULT, Restart
from tests.support.train_runs import run_train, series

COMMON = {"lr_decay_iters": 8, "checkpoint_freq": 2, "train_batch_size": 2}
# elapsed_s is rounded to 0.1 s and each ledger field to 1 ms
ROUNDING_S = 0.05 + len(gw.TIME_FIELDS) * 0.0005


def test_records_carry_the_ledger_and_a_resumed_attempt_measures_as_modeled(tmp_path, monkeypatch):
    started = datetime.now(timezone.utc)
    first = run_train(tmp_path, 2, max_steps=5, **COMMON)  # saves at steps 2 and 4; "fails" after step 5
    failed_at = datetime.now(timezone.utc)
    for r in first:
        assert r["attempt"] == 0 and r["start_step"] == 0
        spent = sum(r[field] for field in gw.TIME_FIELDS.values())
        assert 0 < spent <= r["elapsed_s"] + ROUNDING_S, r
    for name in gw.TIME_FIELDS.values():  # cumulative: never smaller at a later step
        assert series(first, name) == sorted(series(first, name)), name
    assert first[1]["time_checkpoint_s"] == 0 < first[2]["time_checkpoint_s"]  # step 2's save, after its record
    assert all(r["time_steps_s"] > 0 and r["time_data_s"] > 0 for r in first)

    monkeypatch.setenv(ATTEMPT_ENV, "1")  # the bootstrap's restart: the next attempt resumes step 4
    second = run_train(tmp_path, 2, max_steps=8, **COMMON)[len(first):]
    ended = datetime.now(timezone.utc)
    assert series(second, "step") == [5, 6, 7, 8]
    assert {(r["attempt"], r["start_step"]) for r in second} == {(1, 4)}

    restart = Restart(attempt=0, at=failed_at.isoformat(), failure_class=FAULT, reason="test", host="algo-1",
                      restarted=True, step=5, resumed_from=0)
    g = gw.goodput(started, ended, [restart], first + second)
    step_s = [first[-1]["time_steps_s"] / 5, second[-1]["time_steps_s"] / 4]  # each attempt's mean step
    assert g.lost_s["replayed"] == pytest.approx(step_s[0], rel=1e-9)  # step 5, run by both attempts
    assert g.productive_s == pytest.approx(4 * step_s[0] + 4 * step_s[1], rel=1e-9)
    assert g.productive_s + sum(g.lost_s.values()) == pytest.approx(g.wall_s, abs=1e-6)
    assert 0 < g.fraction < 1 and g.lost_s["start-up"] > 0 and g.lost_s["restarts"] > 0
