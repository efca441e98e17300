"""`plan --auto`'s search over instance types, counts and layouts, and its Pareto table.

Throughput figures move with the planner's model, so nothing here hard-codes one: the ranking is
checked against a brute force over what was planned, the global batch against the seed's own
arithmetic, the --set lines by planning the job they make, and the space by what was tried."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.config.jobfile import validate_job_file
from launcher.plan import plan
from launcher.plan.search import search_job_file, set_lines
from launcher.wire.training.catalog import catalog_names, get_instance_type

SEED = Path(__file__).resolve().parents[2] / "configs" / "seed"
P4D_NO_CP = SEED / "p4d-no-cp.yaml"
# The seed's p4d job: train_batch_size 1, no accumulation, 8 GPUs each its own data-parallel rank
# (hybrid_shard_degree 8, no cp/tp): 1 x 1 x 8 = 8 sequences per step.
SEED_GLOBAL_BATCH = 1 * 1 * 8
# What keeps the seed's job from pipelining: it initialises the model on the meta device, loads
# pretrained weights and validates. These make it pipelinable, the model and batch unchanged.
PIPELINABLE = ("hyperparameters.delayed_param=0", "delayed_parameter_initialization=false",
               "hyperparameters.init_from_scratch=1", "hyperparameters.validation_freq=null")


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(autouse=True)
def _no_network(no_network):
    """Planning never touches the network."""


@pytest.fixture(scope="module")
def seed_search():
    return search_job_file(P4D_NO_CP)


def rankable(found):
    return [r for r in found.results if r.fits and r.throughput and r.usd_per_billion_tokens is not None]


def hours_usd(r, tokens):
    hours = tokens / r.tokens_per_s / 3600  # hand arithmetic, not the planner's cost_for
    return hours, hours * r.throughput.usd_per_hour


def test_auto_on_the_seed_p4d_job_picks_among_instance_types_and_counts(seed_search):
    tried = {(r.settings["instance_type"], r.settings["instance_count"]) for r in seed_search.results}
    assert len({t for t, _ in tried}) > 1 and len({c for _, c in tried}) > 1
    assert "ml.p4d.24xlarge" in seed_search.instance_types and seed_search.instance_counts == [1, 2, 4]
    assert {"ml.p5.48xlarge", "ml.p4de.24xlarge"} <= {t for t, _ in tried}

    result = run_cli("plan", P4D_NO_CP, "--auto")
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"searched {len(seed_search.results):,} configurations" in out
    for name in seed_search.instance_types:
        assert name in out
    front = seed_search.front
    assert len(front) >= 1 and "cheapest" in out and "fastest" in out
    for i, r in enumerate(front, 1):
        assert r.settings["instance_type"] in out
        line = next(x for x in out.splitlines() if x.startswith(f"{i}: "))
        assert line == f"{i}: " + " ".join(f"--set {s}" for s in set_lines(r, seed_search.base))


def test_the_front_is_the_non_dominated_set_of_what_fits(seed_search):
    pool = rankable(seed_search)
    assert pool and all(r.fits for r in seed_search.front)
    points = {id(r): hours_usd(r, 1e9) for r in pool}

    def dominated(a, b):  # b at least as good on both, better on one (beyond float noise)
        (ha, ua), (hb, ub) = points[id(a)], points[id(b)]
        return hb <= ha * (1 + 1e-9) and ub <= ua * (1 + 1e-9) and (hb < ha * (1 - 1e-9) or ub < ua * (1 - 1e-9))

    brute = [a for a in pool if not any(dominated(a, b) for b in pool)]
    front_points = sorted((round(h, 6), round(u, 6)) for h, u in (points[id(r)] for r in seed_search.front))
    brute_points = sorted({(round(h, 6), round(u, 6)) for h, u in (points[id(r)] for r in brute)})
    assert front_points == brute_points  # one row per non-dominated (time, $) point
    cheapest, fastest = seed_search.cheapest, seed_search.fastest
    assert points[id(cheapest)][1] == pytest.approx(min(u for _, u in points.values()), rel=1e-9)
    assert points[id(fastest)][0] == pytest.approx(min(h for h, _ in points.values()), rel=1e-9)
    # cheapest first: $ rises and hours fall along the front
    usd = [points[id(r)][1] for r in seed_search.front]
    hours = [points[id(r)][0] for r in seed_search.front]
    assert usd == sorted(usd) and hours == sorted(hours, reverse=True)


def test_every_configuration_keeps_the_jobs_global_batch(seed_search):
    valid = [r for r in seed_search.results if r.valid]
    assert len(valid) > 100
    for r in valid:
        s = r.settings
        assert s["train_batch_size"] * s["gradient_accumulation_steps"] * r.job.layout.data_parallel == \
            SEED_GLOBAL_BATCH, r.overrides
    # several micro batches and both checkpointing settings were tried
    assert {r.settings["train_batch_size"] for r in valid} >= {1, 2}
    assert {bool(r.settings["activation_checkpointing"]) for r in valid} == {True, False}
    assert {r.settings["tensor_parallel_degree"] for r in valid} >= {1, 2, 4, 8}
    assert {r.settings["context_parallel_degree"] for r in valid} >= {1, 2, 4, 8}


def test_the_set_lines_make_the_configuration_they_describe(seed_search):
    for r in (seed_search.cheapest, seed_search.fastest):
        again = plan(validate_job_file(P4D_NO_CP, set_lines(r, seed_search.base)))
        assert again.fits and again.settings == r.settings
        assert again.tokens_per_s == pytest.approx(r.tokens_per_s, rel=1e-12)
        assert again.usd_per_billion_tokens == pytest.approx(r.usd_per_billion_tokens, rel=1e-12)


def test_default_types_are_the_jobs_own_and_priced_8_gpu_nvidia_types(seed_search):
    expected = {n for n in catalog_names() if (t := get_instance_type(n)).accelerators == 8
                and t.accelerator.vendor == "nvidia" and t.accelerator.bf16_tflops and t.usd_per_hour}
    assert set(seed_search.instance_types) == expected | {"ml.p4d.24xlarge"}
    assert "ml.p6-b300.48xlarge" not in expected  # no price: not searched by default
    assert "ml.p3.16xlarge" not in expected  # V100: no bf16 tensor cores


def test_an_fp8_job_searches_only_fp8_instances_and_says_what_it_skipped():
    found = search_job_file(SEED / "p5-cp8-fp8.yaml", instance_types="ml.p4d.24xlarge,ml.p5.48xlarge",
                            max_instances=1)
    assert {r.settings["instance_type"] for r in found.results} == {"ml.p5.48xlarge"}
    assert all(r.settings["fp8"] for r in found.results if r.valid)
    (skip,) = [s for s in found.skipped if s.instance_type == "ml.p4d.24xlarge"]
    assert "FP8" in skip.reason and "hyperparameters.fp8=0" in skip.reason


def test_instance_types_family_and_max_instances_bound_the_space():
    found = search_job_file(P4D_NO_CP, families="p4de", max_instances=2)
    assert {(r.settings["instance_type"], r.settings["instance_count"]) for r in found.results} == {
        ("ml.p4de.24xlarge", 1), ("ml.p4de.24xlarge", 2)}
    found = search_job_file(P4D_NO_CP, instance_types="p5.48xlarge", max_instances=3)
    assert {r.settings["instance_type"] for r in found.results} == {"ml.p5.48xlarge"}
    assert found.instance_counts == [1, 2, 3]


def test_pipeline_parallelism_is_searched_where_the_job_allows_it():
    seed = search_job_file(P4D_NO_CP, families="p4d", max_instances=1)
    pipelined = [r for r in seed.results if r.settings["pipeline_parallel_degree"] > 1]
    assert len(pipelined) == 1 and not pipelined[0].valid  # the first refusal ends pipelining
    assert any("pipeline parallelism" in s.reason and "delayed_param" in s.reason for s in seed.skipped)

    found = search_job_file(P4D_NO_CP, PIPELINABLE, families="p4d", max_instances=1)
    valid = [r for r in found.results if r.valid and r.settings["pipeline_parallel_degree"] > 1]
    assert {r.settings["pipeline_parallel_degree"] for r in valid} == {2, 4}
    for r in valid:
        assert ("microbatches=" + str(r.settings["train_batch_size"] * r.settings["gradient_accumulation_steps"])
                in r.overrides)


def test_a_job_no_fleet_can_run_says_why_and_blames_no_parallelism(tmp_path):
    # the local demo writes to local paths, which SageMaker instance types cannot
    demo = SEED.parent / "local" / "demo.yaml"
    (tmp_path / "train").mkdir()
    (tmp_path / "validation").mkdir()
    inputs = (f"inputs.train={tmp_path / 'train'}", f"inputs.validation={tmp_path / 'validation'}")
    found = search_job_file(demo, inputs, families="p4d", max_instances=1)
    assert found.results and not any(r.valid for r in found.results) and found.front == []
    (skip,) = found.skipped
    assert skip.instance_type == "ml.p4d.24xlarge" and "no configuration is valid" in skip.reason
    assert "output_path" in skip.reason
    result = run_cli("plan", demo, *(a for i in inputs for a in ("--set", i)), "--auto", "--family", "p4d",
                     "--max-instances", "1")
    assert result.exit_code == 1 and "no configuration fits" in result.output


def test_a_deadline_keeps_what_meets_it_and_json_gives_the_same():
    rows = json.loads(run_cli("plan", P4D_NO_CP, "--auto", "--family", "p4d,p5", "--max-instances", "2",
                              "--tokens", "1e10", "--json").output)
    slowest_on_front = max(r["hours"] for r in rows["pareto"])
    fastest = min(r["hours"] for r in rows["pareto"])
    deadline = (slowest_on_front + fastest) / 2  # some of the front meets it, some does not
    result = run_cli("plan", P4D_NO_CP, "--auto", "--family", "p4d,p5", "--max-instances", "2", "--tokens", "1e10",
                     "--deadline", f"{deadline}h", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["deadline_met"] is True and data["deadline_hours"] == pytest.approx(deadline)
    assert data["pareto"] and all(r["hours"] <= deadline for r in data["pareto"])
    assert {r["hours"] for r in rows["pareto"] if r["hours"] <= deadline} <= {r["hours"] for r in data["pareto"]}
    for row in data["pareto"]:
        assert row["fits"] is True and row["set"] and all("=" in s for s in row["set"])
        assert row["usd"] == pytest.approx(row["hours"] * row["usd_per_hour"], rel=1e-3)
    assert sum(r["cheapest"] for r in data["pareto"]) == 1 and sum(r["fastest"] for r in data["pareto"]) == 1
    assert data["tried"] > 0 and set(data["instance_types"]) == {"ml.p4d.24xlarge", "ml.p5.48xlarge",
                                                                 "ml.p5.4xlarge"}


def test_a_deadline_no_configuration_meets_exits_1_and_shows_the_fastest():
    args = ("plan", P4D_NO_CP, "--auto", "--family", "p4d", "--max-instances", "2", "--tokens", "1e10",
            "--deadline", "1m")
    result = run_cli(*args)
    assert result.exit_code == 1
    assert "no configuration meets the deadline of 0.0166667 h" in result.output
    data = json.loads(run_cli(*args, "--json").output)
    assert data["deadline_met"] is False and data["pareto"] == []
    found = search_job_file(P4D_NO_CP, families="p4d", max_instances=2, tokens=1e10, deadline="1m")
    quickest = min(hours_usd(r, 1e10)[0] for r in rankable(found))
    assert data["fastest_fitting"]["hours"] == pytest.approx(quickest, rel=1e-3)
    assert math.isclose(found.deadline_h, 1 / 60)


def test_deadline_counts_double_until_one_meets_it():
    found = search_job_file(P4D_NO_CP, families="p4d", tokens=1e10, deadline="60h")
    counts = sorted({r.settings["instance_count"] for r in found.results})
    assert counts == [2**i for i in range(len(counts))]
    meets = {c: any(r.fits and hours_usd(r, 1e10)[0] <= 60 for r in found.results
                    if r.settings["instance_count"] == c and r.throughput) for c in counts}
    assert meets[counts[-1]] and not any(meets[c] for c in counts[:-1])


@pytest.mark.parametrize(("args", "named"), [
    (("--deadline", "abc", "--tokens", "1e9"), '--deadline = "abc"'),
    (("--deadline", "48h"), "--tokens"),
    (("--max-instances", "0"), "--max-instances = 0"),
    (("--family", "p9"), '--family = "p9"'),
    (("--instance-types", "ml.p4d.24xl"), "did you mean 'ml.p4d.24xlarge'"),
    (("--instance-types", "ml.c5.xlarge"), '--instance-types = "ml.c5.xlarge"'),
    (("--tokens", "-1"), "--tokens = -1"),
])
def test_bad_search_options_exit_2_naming_the_option(args, named):
    result = run_cli("plan", P4D_NO_CP, "--auto", *args)
    assert result.exit_code == 2
    assert named in result.output and "error" in result.output and "Traceback" not in result.output
    assert "searched" not in result.output


def test_search_options_need_the_search():
    alone = run_cli("plan", P4D_NO_CP, "--max-instances", "2")
    assert alone.exit_code == 2 and "--max-instances" in alone.output and "add --auto" in alone.output
    swept = run_cli("plan", P4D_NO_CP, "--auto", "--sweep", "context_parallel_degree=1,2", "--family", "p4d")
    assert swept.exit_code == 2 and "--family" in swept.output and "--sweep" in swept.output


def test_auto_says_what_it_models_first_as_a_single_plan_does():
    """plan's first line says what it models; --auto's did not (issue 38, item 8)."""
    single = run_cli("plan", P4D_NO_CP).output.splitlines()[0]  # the control: a single plan
    assert single.startswith("models: smlaunch's runtime (entrypoints/train.py)")
    args = ("plan", P4D_NO_CP, "--auto", "--family", "p4d", "--max-instances", "1")
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == single
    assert f"models: {json.loads(run_cli(*args, '--json').output)['models']}" == single
