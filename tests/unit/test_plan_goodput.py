"""Goodput planned before launch (launcher/plan/goodput.py, `smlaunch plan --failure-rate`): the
failure rate, Young's interval, the loss model and the from-step-0 model against
computations written out here, and the CLI's text, JSON and refusals."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.plan import goodput as gp
from tests.support.train_runs import ROOT

SEED = ROOT / "configs" / "seed"
LLAMA_31_8B_PARAMS = 8_030_261_248  # Meta's model card, embeddings and head untied
GIB = 2**30
# the seed's p4d job: 8 ranks on one host, the model sharded 8 ways; a checkpoint holds per rank
# the fp32 weights (4 B) and AdamW's two fp32 moments (8 B) of 1/8 of the parameters
STATE_GIB = 12 * LLAMA_31_8B_PARAMS / 8 / GIB
HASH_S_PER_GIB = 0.75  # BENCHMARKS.md, "Verified checkpoints": ~0.75 s/GiB per rank
STAGING_S_PER_GIB = 0.5  # BENCHMARKS.md, issue 32: the async stall of a 1 GiB save, 0.50 s
STARTUP_S = 60.0  # docs/faults.md: the assumed start-up of a restart


@pytest.fixture(autouse=True)
def _no_network(no_network):
    """Planning never touches the network."""


def _plan(*args: str):
    return CliRunner().invoke(main, ["plan", str(SEED / "p4d-no-cp.yaml"), *args], catch_exceptions=False)


def _goodput_row(*args: str) -> dict:
    result = _plan("--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)[0]


def _sets(**hyperparameters) -> list[str]:
    out = []
    for key, value in hyperparameters.items():
        out += ["--set", f"hyperparameters.{key}={value}"]
    return out


# --- the formulas, by hand ----------------------------------------------------------------------

def test_the_default_rate_is_llama_3s_419_interruptions_in_54_days_on_16384_gpus():
    assert gp.DEFAULT_FAILURE_RATE == pytest.approx(419 / (54 * 24 * 16_384), rel=1e-12)
    # the "one every ~3 hours" on the whole cluster: 1,296 hours / 419
    assert gp.mtbf_hours(gp.DEFAULT_FAILURE_RATE, 16_384) == pytest.approx(1296 / 419, rel=1e-12)
    # control: 8 GPUs fail 2,048 times less often
    assert gp.mtbf_hours(gp.DEFAULT_FAILURE_RATE, 8) == pytest.approx(2048 * 1296 / 419, rel=1e-12)


def test_young_interval_and_the_loss():
    assert gp.young_interval(100.0, 20_000.0) == pytest.approx(2000.0, rel=1e-12)  # sqrt(2 x 100 x 20,000)
    # 100 s of saves in every 2,100 s + (1000 + 50)/20,000 of redone training and restarts
    assert gp.lost_fraction(2000.0, 100.0, 50.0, 20_000.0) == pytest.approx(100 / 2100 + 0.0525, rel=1e-12)
    # an async save's lag counts per failure, as redone training does
    assert gp.lost_fraction(2000.0, 100.0, 50.0, 20_000.0, lag_s=200.0) == pytest.approx(100 / 2100 + 0.0625,
                                                                                         rel=1e-12)
    # Young's first order, C/τ for the saves, where a save is short against the interval (C << τ)
    assert gp.lost_fraction(2000.0, 1.0, 50.0, 2e6) == pytest.approx(1 / 2000 + 1050 / 2e6, rel=1e-3)
    # Young's interval minimises C/τ + τ/(2M); a save's own length moves the minimum by about C
    best = gp.lost_fraction(2000.0, 1.0, 50.0, 2e6)
    assert gp.lost_fraction(1900.0, 1.0, 50.0, 2e6) > best < gp.lost_fraction(2100.0, 1.0, 50.0, 2e6)


def test_a_save_longer_than_the_training_between_saves_leaves_the_plain_share():
    """Issue 49: the seed's p5 FP8 job saves 105 s every 13 s of training, and the plan said 0.0%
    (C/τ, first order, is 800% there); the saves leave τ/(τ + C) of the time training, ~11%."""
    plan = gp.GoodputPlan(failure_rate=gp.DEFAULT_FAILURE_RATE, gpus=8, step_s=1.31, state_gib=11.22,
                          state="fp32 weights + AdamW moments", ranks_per_host=8, replicas=1, write_gb_s=1.0,
                          asynchronous=False, max_steps=15, checkpoint_freq=10, script=False)
    write_s = 11.22 * GIB * 8 / 1e9
    save_s = write_s + 11.22 * HASH_S_PER_GIB  # 104.8 s
    assert plan.checkpoint_s == pytest.approx(save_s, rel=1e-9)
    interval, restart_s, mtbf_s = 10 * 1.31, STARTUP_S + save_s, 3600 / (gp.DEFAULT_FAILURE_RATE * 8)
    assert plan.goodput_every(10) == pytest.approx(interval / (interval + save_s) - (interval / 2 + restart_s) / mtbf_s,
                                                   rel=1e-9)
    assert "11.1% at checkpoint_freq 10 (13.1 s between saves) (a save stalls training longer than it trains " \
           "between saves: a larger checkpoint_freq trains more)" in plan.text()
    # control: at the optimum a save is short against the interval, and the figure is first order's
    optimum = plan.optimum_steps * 1.31
    first_order = 1 - save_s / optimum - (optimum / 2 + restart_s) / mtbf_s
    assert plan.goodput_every(plan.optimum_steps) == pytest.approx(first_order, abs=1e-5)


def test_a_run_that_restarts_from_step_0():
    # run = MTBF: 1 / (e - 1) of the wall trains; with restarts of a tenth of the MTBF, 1 / (1.1 (e - 1))
    assert gp.goodput_from_step_zero(3600.0, 0.0, 3600.0) == pytest.approx(1 / (math.e - 1), rel=1e-12)
    assert gp.goodput_from_step_zero(3600.0, 360.0, 3600.0) == pytest.approx(1 / (1.1 * (math.e - 1)), rel=1e-12)
    # controls: a run far shorter than the MTBF loses about half itself per MTBF; a far longer one never ends
    assert gp.goodput_from_step_zero(1.0, 0.0, 1e6) == pytest.approx(1 - 0.5e-6, abs=1e-9)
    assert gp.goodput_from_step_zero(1e6, 0.0, 1.0) == 0.0


# --- the CLI ------------------------------------------------------------------------------------

def test_plan_json_has_the_goodput_of_the_seed_job_computed_by_hand():
    row = _goodput_row(*_sets(max_steps=100_000, checkpoint_freq=500), "--failure-rate", "1e-3")
    g = row["goodput"]
    mtbf_s = 3600 / (1e-3 * 8)
    write_s = STATE_GIB * GIB * 8 / 1e9  # a host's 8 ranks through 1 GB/s
    checkpoint_s = write_s + STATE_GIB * HASH_S_PER_GIB
    restart_s = STARTUP_S + checkpoint_s  # the load reads what the save wrote, and verifies it
    assert g["mtbf_hours"] == pytest.approx(125.0, rel=1e-12)
    assert g["checkpoint_gib_per_rank"] == pytest.approx(STATE_GIB, abs=1e-3)
    assert g["checkpoint_s"] == pytest.approx(checkpoint_s, abs=0.01)
    assert g["restart_s"] == pytest.approx(restart_s, abs=0.01)
    optimum = math.sqrt(2 * checkpoint_s * mtbf_s)
    assert g["optimum_interval_s"] == pytest.approx(optimum, abs=0.1)
    step_s = row["step_s"]  # the planner's step time, rounded to 0.1 ms
    assert abs(g["optimum_interval_steps"] - optimum / step_s) <= 0.5 + optimum / step_s * 1e-4
    interval = 500 * step_s
    expected = 1 - checkpoint_s / (interval + checkpoint_s) - (interval / 2 + restart_s) / mtbf_s
    assert g["goodput_at_checkpoint_freq"] == pytest.approx(expected, abs=1e-4)
    assert g["goodput_of_job"] == g["goodput_at_checkpoint_freq"]
    assert g["goodput_at_optimum"] >= g["goodput_at_checkpoint_freq"]


def test_the_options_move_the_figures_as_the_model_says():
    base = _goodput_row("--failure-rate", "1e-3")["goodput"]
    tenfold = _goodput_row("--failure-rate", "1e-2")["goodput"]
    assert tenfold["mtbf_hours"] == pytest.approx(base["mtbf_hours"] / 10, rel=1e-9)
    assert tenfold["optimum_interval_s"] == pytest.approx(base["optimum_interval_s"] / math.sqrt(10), rel=1e-4)
    faster = _goodput_row("--failure-rate", "1e-3", "--checkpoint-write-gb-s", "2")["goodput"]
    write_s = STATE_GIB * GIB * 8 / 1e9
    assert base["checkpoint_s"] - faster["checkpoint_s"] == pytest.approx(write_s / 2, abs=0.01)
    # control: without the options, Llama 3's rate on 8 GPUs
    default = _goodput_row()["goodput"]
    assert default["mtbf_hours"] == pytest.approx(2048 * 1296 / 419, rel=1e-9)


def test_replicas_write_each_shard_once_and_all_read_theirs_back():
    one, two = _goodput_row()["goodput"], _goodput_row("--set", "instance_count=2")["goodput"]
    # two p4d hosts with hybrid_shard_degree 8: each shard has 2 replicas; DCP writes it once, its
    # replicas sharing the bytes, and at a restart each replica reads the whole shard
    assert two["replicas"] == 2 and one["replicas"] == 1
    assert two["write_s"] == pytest.approx(one["write_s"] / 2, abs=0.002)
    assert two["load_s"] == pytest.approx(one["load_s"], abs=0.002)
    assert one["write_s"] == pytest.approx(STATE_GIB * GIB * 8 / 1e9, abs=0.01) == one["load_s"]


def test_an_asynchronous_save_stalls_for_the_copy_and_commits_after_the_write():
    g = _goodput_row(*_sets(checkpoint_async_mode="async"))["goodput"]
    assert g["checkpoint_s"] == pytest.approx(STATE_GIB * STAGING_S_PER_GIB, abs=0.01)
    assert g["checkpoint_lag_s"] == pytest.approx(STATE_GIB * GIB * 8 / 1e9 + STATE_GIB * HASH_S_PER_GIB, abs=0.01)
    assert _goodput_row()["goodput"]["checkpoint_lag_s"] == 0  # control: a synchronous save commits at once


def test_a_job_without_checkpoints_restarts_from_step_0():
    row = _goodput_row(*_sets(checkpoint_freq="null", max_steps=20_000), "--failure-rate", "1e-3")
    g = row["goodput"]
    run_s, mtbf_s = 20_000 * row["step_s"], 3600 / (1e-3 * 8)
    expected = run_s / ((mtbf_s + STARTUP_S) * (math.exp(run_s / mtbf_s) - 1))
    assert g["checkpoint_freq"] is None and g["goodput_at_checkpoint_freq"] is None
    assert g["goodput_of_job"] == pytest.approx(expected, abs=1e-4)
    text = _plan(*_sets(checkpoint_freq="null", max_steps=20_000), "--failure-rate", "1e-3").output
    assert "without checkpoint_freq (every failure restarts from step 0)" in " ".join(text.split())


def test_plan_text_says_mtbf_the_formula_the_interval_in_steps_and_both_goodputs():
    result = _plan(*_sets(max_steps=100_000, checkpoint_freq=500), "--failure-rate", "1e-3")
    assert result.exit_code == 0, result.output
    row = _goodput_row(*_sets(max_steps=100_000, checkpoint_freq=500), "--failure-rate", "1e-3")["goodput"]
    out = " ".join(result.output.split())
    assert "goodput: 8 GPUs at 0.001 interruptions per GPU-hour (--failure-rate): MTBF 125 h" in out
    assert "Young: sqrt(2 x" in out and f"= {row['optimum_interval_steps']:,} steps of" in out
    assert f"{row['goodput_at_checkpoint_freq']:.1%} at checkpoint_freq 500" in out
    assert f"{row['goodput_at_optimum']:.1%} at the optimum" in out
    default = " ".join(_plan().output.split())  # control: the default rate names its source
    assert "Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs" in default


def test_a_script_of_ones_own_is_planned_without_knowing_its_checkpoints(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hello')\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"extends: {SEED / 'p4d-no-cp.yaml'}\nsource_dir: {src}\nimage_uri: null\n"
                   "framework_version: '2.4.1'\npy_version: py311\n"
                   "distribution: {smdistributed: {modelparallel: {parameters: {context_parallel_degree: 2}}}}\n")
    result = CliRunner().invoke(main, ["plan", str(job)], catch_exceptions=False)
    out = " ".join(result.output.split())
    assert result.output.startswith("models: AWS's SMP v2 reference program"), result.output
    assert "the planner does not know your script's checkpoints" in out
    row = json.loads(CliRunner().invoke(main, ["plan", str(job), "--json"], catch_exceptions=False).output)[0]
    assert row["goodput"]["goodput_of_job"] is None and row["goodput"]["goodput_at_optimum"] > 0


@pytest.mark.parametrize("option", ["--failure-rate", "--checkpoint-write-gb-s"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "often"])
def test_a_bad_option_value_is_refused_with_exit_2(option, value):
    result = _plan(option, value)
    assert result.exit_code == 2, result.output
    assert f"{option} = {value}: not " in result.output and "above 0; give a positive number" in result.output
    assert "Traceback" not in result.output and "goodput:" not in result.output


def test_goodput_options_are_refused_by_autos_search():
    result = _plan("--auto", "--failure-rate", "1e-3")
    assert result.exit_code == 2 and "--failure-rate: for a single plan or --sweep" in result.output
    swept = _plan("--sweep", "context_parallel_degree=1,2", "--failure-rate", "1e-3", "--json")  # control
    assert swept.exit_code == 0
    assert all(r["goodput"]["mtbf_hours"] == pytest.approx(125.0) for r in json.loads(swept.output))


def test_how_likely_a_run_ends_without_a_person_at_its_max_restarts():
    # 8 GPUs at 0.25 interruptions per GPU-hour: MTBF 1,800 s; 720 steps of 10 s: 4 expected
    plan = gp.GoodputPlan(failure_rate=0.25, gpus=8, step_s=10.0, state_gib=1.0, state="fp32", ranks_per_host=8,
                          replicas=1, write_gb_s=1.0, asynchronous=False, max_steps=720, checkpoint_freq=10,
                          script=False, max_restarts=2)
    assert plan.expected_failures == pytest.approx(4.0, rel=1e-12)
    assert plan.unattended == pytest.approx(math.exp(-4) * (1 + 4 + 16 / 2), rel=1e-12)  # Poisson, k <= 2
    assert "max_restarts 2: the job ends without a person's help with probability 23.8%" in plan.text()
    none = gp.GoodputPlan(**{**plan.__dict__, "max_restarts": 0})  # control: the first interruption ends it
    assert none.unattended == pytest.approx(math.exp(-4), rel=1e-12)
    assert "max_restarts 0: the first one ends the job" in none.text()
    row = _goodput_row(*_sets(max_steps=100_000, checkpoint_freq=500), "--failure-rate", "1e-3")
    expected = 100_000 * row["step_s"] / (3600 / (1e-3 * 8))
    assert row["goodput"]["max_restarts"] == 0
    assert row["goodput"]["expected_interruptions"] == pytest.approx(expected, rel=1e-3)  # step_s is rounded


# --- shrinks (min_instance_count) ----------------------------------------------------------------

def test_the_slowdown_after_shrinks_against_its_closed_forms():
    # 2 hosts down to 1: a loss with u of the work done doubles the rest's time; with K ~ Poisson(L) losses the
    # first falls at E[K/(K + 1)] of the work from its end, so s = 1 - (1 - e^-L)/L: e^-1 at L = 1
    assert gp.shrink_slowdown(2, 1, 1.0) == pytest.approx(math.exp(-1), rel=1e-12)
    # 3 hosts down to 1: the first loss adds 3/2 - 1 over E[K/(K + 1)] of the work, the second 3 - 3/2 over
    # E[(K - 1)+/(K + 1)] = 1 - 2(1 - e^-L)/L + e^-L
    by_hand = 0.5 * math.exp(-1) + 1.5 * (1 - 2 * (1 - math.exp(-1)) + math.exp(-1))
    assert gp.shrink_slowdown(3, 1, 1.0) == pytest.approx(by_hand, rel=1e-12)
    # rare losses: half the run on a host fewer each, L/(2(N - 1)); very many: all of it on M hosts, N/M - 1
    assert gp.shrink_slowdown(2, 1, 1e-6) == pytest.approx(0.5e-6, rel=1e-5)
    assert gp.shrink_slowdown(64, 32, 1e5) == pytest.approx(1.0, rel=1e-3)
    # controls: a job that may not shrink, and a run that meets no interruption
    assert gp.shrink_slowdown(2, 2, 1.0) == 0.0 and gp.shrink_slowdown(2, 1, 0.0) == 0.0


def test_a_job_that_may_shrink_plans_its_goodput_over_the_slower_steps():
    # 2 hosts of 8 GPUs at 1/16 interruptions per GPU-hour: MTBF 3,600 s; 3,600 steps of 1 s: one expected
    plan = gp.GoodputPlan(failure_rate=1 / 16, gpus=16, step_s=1.0, state_gib=1.0, state="fp32", ranks_per_host=8,
                          replicas=1, write_gb_s=1.0, asynchronous=False, max_steps=3600, checkpoint_freq=100,
                          script=False, max_restarts=2, hosts=2, min_hosts=1)
    checkpoint_s = GIB * 8 / 1e9 + HASH_S_PER_GIB  # a host's 8 GiB through 1 GB/s, and one rank's hashing
    restart_s = STARTUP_S + checkpoint_s
    unshrunk = 1 - checkpoint_s / (100 + checkpoint_s) - (50 + restart_s) / 3600
    assert plan.goodput_every(100) == pytest.approx(unshrunk / (1 + math.exp(-1)), rel=1e-12)
    assert "+36.8% of training time expected, if each of the first 1 interruption(s) loses its host" in plan.text()
    # the control: min_instance_count = instance_count (or none) never shrinks, and plans the figure as before
    for least in (2, 0):
        fixed = gp.GoodputPlan(**{**plan.__dict__, "min_hosts": least})
        assert fixed.slowdown == 0.0 and fixed.goodput_every(100) == pytest.approx(unshrunk, rel=1e-12)
        assert "after shrinks" not in fixed.text()


def test_plan_json_prices_a_shrink_where_min_instance_count_is_below_instance_count():
    common = ("--set", "instance_count=2", "--set", "backend=slurm", "--set", "max_restarts=2",
              *_sets(max_steps=100_000, checkpoint_freq=500), "--failure-rate", "1e-3")
    shrinks = _goodput_row(*common, "--set", "min_instance_count=1")["goodput"]
    fixed = _goodput_row(*common, "--set", "min_instance_count=2")["goodput"]  # the control: it never shrinks
    interruptions = shrinks["expected_interruptions"]
    slowdown = 1 - (1 - math.exp(-interruptions)) / interruptions  # one loss of 2 hosts' 1 at most
    assert (shrinks["min_instance_count"], shrinks["shrink_slowdown"]) == (1, pytest.approx(slowdown, rel=1e-9))
    assert shrinks["goodput_of_job"] == pytest.approx(fixed["goodput_of_job"] / (1 + slowdown), rel=1e-9)
    assert (fixed["min_instance_count"], fixed["shrink_slowdown"]) == (2, 0.0)
    assert fixed["goodput_of_job"] == _goodput_row(*common)["goodput"]["goodput_of_job"]
