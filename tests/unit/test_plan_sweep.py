"""Sweeps, --auto, and what the planner prints (table, JSON, the OOM explanation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from launcher.config import ConfigError
from launcher.config.jobfile import validate_job_file
from launcher.plan import (
    auto,
    auto_job_file,
    default_space,
    explain_oom,
    parse_sweeps,
    plan,
    render_table,
    sweep_job_file,
)

SEED = Path(__file__).resolve().parents[2] / "configs" / "seed"
P4D_NO_CP = SEED / "p4d-no-cp.yaml"
# The seed's own loss, on the whole fp32 logits: its OOM (smlaunch's default chunked loss fits)
WHOLE_LOGITS = ["hyperparameters.loss_chunk_tokens=0"]
JSON_KEYS = {"fits", "peak_gib", "capacity_gib", "largest_allocation_gib", "tokens_per_s", "usd_per_billion_tokens",
             "instance_type", "instance_count", "hybrid_shard_degree", "context_parallel_degree",
             "tensor_parallel_degree", "activation_checkpointing", "fp8", "train_batch_size"}


def rendered(table) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(table)
    return console.export_text()


@pytest.fixture(scope="module")
def cp_sweep():
    return sweep_job_file(P4D_NO_CP, WHOLE_LOGITS, sweeps=["context_parallel_degree=1,2,3,4,8"])


def test_cp_sweep_on_the_seed_p4d_job(cp_sweep):
    by_cp = {r.settings["context_parallel_degree"]: r for r in cp_sweep}
    assert [r.overrides for r in cp_sweep] == [(f"context_parallel_degree={c}",) for c in (1, 2, 3, 4, 8)]
    assert by_cp[1].valid and by_cp[1].fits is False  # the seed's OOM
    assert by_cp[3].valid is False and by_cp[3].memory is None
    assert any("context_parallel_degree" in e and "must divide" in e for e in by_cp[3].errors)
    for cp in (2, 4, 8):
        assert by_cp[cp].valid and by_cp[cp].fits is True, cp
    # the activation terms shrink with cp on the real job too
    assert by_cp[8].memory.gib("activations") < by_cp[4].memory.gib("activations") < by_cp[2].memory.gib("activations")


def test_auto_picks_the_cheapest_fitting_configuration(cp_sweep):
    best = auto(cp_sweep)
    assert best is not None and best.fits is True
    fitting = [r for r in cp_sweep if r.fits]
    assert best.usd_per_billion_tokens == min(r.usd_per_billion_tokens for r in fitting)
    # equal cost: the smallest cp wins (less communication)
    assert best.settings["context_parallel_degree"] == min(
        r.settings["context_parallel_degree"] for r in fitting
        if r.usd_per_billion_tokens == best.usd_per_billion_tokens)


def test_auto_without_sweeps_searches_the_default_space():
    job = validate_job_file(P4D_NO_CP)
    space = default_space(job)
    assert space["context_parallel_degree"] == [1, 2, 4, 8] and space["hybrid_shard_degree"] == [1, 2, 4, 8]
    assert set(space["hyperparameters.activation_checkpointing"]) == {0, 1}
    best, results = auto_job_file(P4D_NO_CP)
    assert len(results) == 4 * 4 * 2
    assert best.fits is True and best.valid
    fitting = [r for r in results if r.fits]
    assert best.usd_per_billion_tokens == min(r.usd_per_billion_tokens for r in fitting)
    assert any(r.fits is False for r in results) and any(not r.valid for r in results)


def test_auto_returns_none_when_nothing_fits():
    results = sweep_job_file(P4D_NO_CP, ["hyperparameters.activation_checkpointing=0"],
                             {"context_parallel_degree": [1]})
    assert results[0].fits is False and auto(results) is None


def test_sweep_values_may_be_python_values_and_no_sweep_plans_the_job():
    results = sweep_job_file(P4D_NO_CP, sweeps={"context_parallel_degree": [8],
                                                 "hyperparameters.activation_checkpointing": [True]})
    assert results[0].settings["context_parallel_degree"] == 8 and results[0].fits
    (only,) = sweep_job_file(P4D_NO_CP, WHOLE_LOGITS)
    assert only.overrides == () and only.fits is False
    (chunked,) = sweep_job_file(P4D_NO_CP)
    assert chunked.overrides == () and chunked.fits is True


def test_parse_sweeps():
    assert parse_sweeps(["context_parallel_degree=1,2, 4", "hybrid_shard_degree=8"]) == {
        "context_parallel_degree": ["1", "2", "4"], "hybrid_shard_degree": ["8"]}
    with pytest.raises(ConfigError, match="KEY=V1,V2"):
        parse_sweeps(["context_parallel_degree"])
    with pytest.raises(ConfigError, match="swept twice"):
        parse_sweeps(["context_parallel_degree=1", "context_parallel_degree=2"])


def test_json_rows_carry_the_fields_the_cli_emits(cp_sweep):
    rows = json.loads(json.dumps([r.to_dict() for r in cp_sweep]))
    for row in rows:
        assert JSON_KEYS <= set(row)
    one = rows[0]
    assert one["fits"] is False and one["capacity_gib"] == 40
    assert one["largest_allocation_gib"] == pytest.approx(16384 * 128256 * 4 / 2**30, abs=0.01)
    assert one["usd_per_billion_tokens"] == pytest.approx(
        one["usd_per_hour"] / (one["tokens_per_s"] * 3600) * 1e9, rel=1e-3)
    invalid = rows[2]
    assert invalid["valid"] is False and invalid["fits"] is None and invalid["errors"]
    assert invalid["context_parallel_degree"] == 3


def test_table_shows_fit_oom_and_invalid_rows(cp_sweep):
    text = rendered(render_table(cp_sweep, best=auto(cp_sweep), title="p4d-no-cp"))
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if line.startswith("│") and "cp=" in line}
    assert " no " in lines["cp=1"]
    assert "7.83" in lines["cp=1"] and "logits" in lines["cp=1"]
    assert "invalid" in lines["cp=3"]
    assert "yes" in lines["* cp=2"]  # auto's pick is marked
    assert all("/ 40" in lines[k] for k in ("cp=1", "* cp=2", "cp=4", "cp=8"))


def test_explain_oom_names_the_term_the_allocation_and_the_fix():
    result = plan(validate_job_file(P4D_NO_CP, WHOLE_LOGITS))
    assert result.oom
    text = explain_oom(result.memory)
    assert "does not fit" in text
    assert "logits + loss (fp32)" in text  # the dominant term
    assert "Tried to allocate 7.83 GiB" in text
    assert "--set context_parallel_degree=2" in text  # the smallest cp that fits


def test_plan_of_a_fitting_job_has_no_advice():
    result = plan(validate_job_file(SEED / "p5-cp8-fp8.yaml"))
    assert result.valid and result.fits and not result.memory.advice
    assert result.to_dict()["fp8"] is True
