"""bench/gpu/run.py's CPU side: the no-CUDA refusal, the run table, the runtime's refusal of settings
it does not know, the figures and the planner's prediction (the GPU figures come from the device)."""

from __future__ import annotations

import pytest
import torch

from bench.gpu import run as bench_run
from bench.gpu import table, trainpy
from bench.gpu.measure import Outcome, compare, figures
from bench.gpu.planner import against, predict


def test_without_cuda_it_exits_2_at_once_naming_the_dry_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_run.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "--dry-run" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()  # nothing written after the error


def test_an_unknown_part_is_refused_by_name(capsys):
    assert bench_run.main(["--only", "1b,gpt", "--dry-run"]) == 2
    assert "gpt" in capsys.readouterr().err


def test_the_table_runs_every_stack_eager_and_compiled_on_the_same_tokens():
    full = table.table(dry_run=False)
    one = full["1b"]
    assert {(r.stack, r.hyperparameters.get("compile", 0)) for r in one} == {
        (s, c) for s in table.STACKS for c in (0, 1)}
    assert {(r.model, r.seq_len, r.tokens_per_step) for r in one} == {("llama3.2-1b", 8192, 8192)}
    assert {r.model for r in full["3b"]} == {"llama3.2-3b"}
    # the FP8 runs compare with train.py's compiled bf16 run of as many steps (the same data and seed)
    base = next(r for r in one if r.name == "1b-trainpy-compiled")
    for run in full["fp8"]:
        assert run.baseline == base.name and run.steps == base.steps == 200
        assert run.hyperparameters["seed"] == base.hyperparameters["seed"]
    # the control: the dry run is the same table at tiny shapes
    assert {r.seq_len for r in table.table(dry_run=True)["1b"]} == {128}


def test_the_lora_run_is_the_full_fine_tunes_shape_with_adapters_and_the_runtime_takes_it():
    full = table.table(dry_run=False)
    (lora,) = full["lora"]
    base = next(r for r in full["1b"] if r.name == lora.baseline)
    assert base.name == "1b-trainpy-eager" and lora.stack == "trainpy"
    assert (lora.model, lora.seq_len, lora.tokens_per_step, lora.steps) == (base.model, base.seq_len,
                                                                           base.tokens_per_step, base.steps)
    assert {k: v for k, v in lora.hyperparameters.items() if k not in base.hyperparameters} == {
        "use_peft": 1, "lora_target_modules": "all-linear"}
    assert trainpy.refusal(lora) is None
    # the trace: train.py's eager runs (this one among them), not a compiled or FP8 run, nor a peer
    assert bench_run.traced(lora) and bench_run.traced(base)
    assert not any(bench_run.traced(r) for r in full["fp8"] + [r for r in full["1b"] if r is not base])


def test_every_trainpy_run_profiles_its_last_step_and_the_runtime_takes_the_window():
    from launcher.config import TrainingHyperparameters
    from launcher.wire.training.speed_rules import speed_issues

    for dry_run in (False, True):
        runs = [r for runs in table.table(dry_run).values() for r in runs if r.stack == "trainpy"]
        assert runs
        for run in runs:
            hp = trainpy.profiled(run).hyperparameters
            assert hp["profile_steps"] == str(run.steps) == str(hp["max_steps"])
            assert speed_issues(TrainingHyperparameters.model_validate(hp)) == [], run.name
    # the control: a window past the run's steps is what the runtime refuses
    late = {**trainpy.profiled(runs[0]).hyperparameters, "profile_steps": str(runs[0].steps + 1)}
    assert speed_issues(TrainingHyperparameters.model_validate(late))


def test_a_setting_the_runtime_does_not_know_is_a_skip_with_its_name():
    run = table.Run("x", "1b", "trainpy", "llama3-tiny", 128, 3, 1, {"model_preset": "llama3-tiny", "no_such": 1})
    assert trainpy.refusal(run) == "unknown hyperparameter no_such"
    bad = table.Run("x", "1b", "trainpy", "llama3-tiny", 128, 3, 1, {"fp8_recipe": "no_such_recipe"})
    assert "fp8_recipe='no_such_recipe'" in trainpy.refusal(bad)
    assert trainpy.refusal(table.Run("x", "1b", "trainpy", "llama3-tiny", 128, 3, 1, {"bf16": 1})) is None


def test_figures_time_only_the_steps_after_the_warm_up():
    run = table.Run("b", "fp8", "trainpy", "llama3.2-1b", 8192, 5, 2, {}, baseline="a")
    record = figures(run, Outcome("ok", step_s=[9.0, 5.0, 0.5, 0.25, 0.5], losses=[3.0, 2.5]), peak_tflops=989.0)
    assert record["step_s_median"] == 0.5 and record["timed_steps"] == 3
    assert record["tokens_per_s"] == 8192 / 0.5
    # 6·N + 6·L·H·d·S/2... per token for the 1B at 8K: ~9.0 GFLOP (table.py's estimate), well within 1%
    assert record["tflops"] == pytest.approx(16384 * 9.0e9 / 1e12, rel=0.01)
    assert record["mfu"] == record["tflops"] / 989.0
    base = figures(table.Run("a", "1b", "trainpy", "llama3.2-1b", 8192, 3, 1, {}),
                   Outcome("ok", step_s=[9.0, 1.0, 1.0], losses=[3.0, 2.0]), peak_tflops=None)
    assert base["mfu"] is None
    records = {"a": base, "b": record}
    compare(records)
    assert record["vs_baseline"]["speedup"] == 2.0
    assert record["vs_baseline"]["loss_diff_last"] == 0.5 and record["vs_baseline"]["loss_steps"] == 2
    # a run with nothing after its warm-up is a failure, not a figure
    short = figures(run, Outcome("ok", step_s=[1.0, 1.0]), peak_tflops=None)
    assert short["status"] == "failed" and "tokens_per_s" not in short


def test_the_planner_predicts_each_trainpy_run_as_smlaunch_plan_does():
    one = next(r for r in table.table(dry_run=False)["1b"] if r.name == "1b-trainpy-eager")
    three = next(r for r in table.table(dry_run=False)["3b"] if r.name == "3b-trainpy-eager")
    p1, p3 = predict(one), predict(three)
    assert p1["instance_type"] == "ml.p5.4xlarge" and "error" not in p1
    # 16 B of weights, gradients and Adam state per parameter alone: 1.24B -> 18.4 GiB, 3.2B -> 48 GiB
    assert p1["peak_gib"] > 1.24e9 * 16 / 2**30 and p3["peak_gib"] > 3.2e9 * 16 / 2**30
    assert p3["step_s"] > 2 * p1["step_s"]
    out = against(p1, {"peak_memory_gib": p1["peak_gib"] * 1.1, "step_s_median": p1["step_s"] / 2})
    assert out["memory_ratio"] == pytest.approx(1.1) and out["step_ratio"] == pytest.approx(0.5)


def test_every_module_that_asks_for_cuda_marks_its_gpu_tests():
    """`pytest -m gpu` (bench/gpu/gputests.py) reaches every test that needs CUDA: a module that asks
    torch for CUDA has tests carrying the mark. The control: a module without CUDA has none."""
    from bench.gpu.gputests import ROOT, gpu_test_files

    asks = "cuda." + "is_available()"  # spelt in two, so that this module is not one of them
    needing = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if asks in p.read_text()}
    assert needing and set(gpu_test_files()) == needing
    assert "tests/unit/test_flops.py" not in gpu_test_files()
