"""`smlaunch tune` and what the other commands do with a sweep, in one process: the errors (exit 2,
nothing started), the dry run, `status` of a damaged sweep. Real sweeps: tests/integration/test_tune.py."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.tune import state
from tests.support.local_jobs import HP
from tests.support.train_runs import ROOT

JOB = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
       "instance_count": 1, "processes_per_host": 1, "distribution": {"torch_distributed": {"enabled": True}},
       "hyperparameters": HP}
TUNING = {"objective": {"metric": "validation:loss", "type": "Minimize"}, "strategy": "Grid",
          "ranges": {"lr": {"kind": "categorical", "values": [0.001, 0.01, 0.1]}}}


def write(tmp_path, **fields):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **fields}))
    return path


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_tune_needs_a_tuning_section(tmp_path, home):
    result = cli("tune", write(tmp_path))
    assert result.exit_code == 2 and "has no tuning: section" in result.stderr
    assert not state.sweeps_root().exists()  # nothing written


def test_submit_refuses_a_job_file_with_a_tuning_section(tmp_path, home):
    result = cli("submit", write(tmp_path, tuning=TUNING))
    assert result.exit_code == 2 and "smlaunch tune" in result.stderr
    assert not (home / "jobs").exists()
    # control: the same file without it passes validation and submits as far as a dry run
    assert cli("submit", write(tmp_path), "--dry-run").exit_code == 0


@pytest.mark.parametrize(("tuning", "args", "said"), [
    ({**TUNING, "strategy": "Hyperband", "max_jobs": 3}, (), 'tuning.strategy = "Hyperband"'),
    ({**TUNING, "objective": {"metric": "val:acc", "type": "Maximize"}}, (), 'tuning.objective.metric = "val:acc"'),
    ({**TUNING, "ranges": {"lr": {"kind": "continuous", "min_value": 0.1, "max_value": 0.01}}}, (), "min_value"),
])
def test_what_a_local_sweep_cannot_run_is_an_exit_2_error_naming_the_field(tmp_path, home, tuning, args, said):
    result = cli("tune", write(tmp_path, tuning=tuning), *args, "--dry-run")
    assert result.exit_code == 2, result.output
    assert said in result.stderr and "Traceback" not in result.output
    assert not state.sweeps_root().exists()


def test_dry_run_lists_grid_trials_and_says_what_bayesian_does(tmp_path, home):
    result = cli("tune", write(tmp_path, tuning=TUNING), "--dry-run")
    assert result.exit_code == 0, result.output
    assert [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("  trial")] == [
        "lr=0.001", "lr=0.01", "lr=0.1"]
    bayesian = {**TUNING, "strategy": "Bayesian", "max_jobs": 4, "random_seed": 3}
    result = cli("tune", write(tmp_path, tuning=bayesian), "--dry-run")
    assert result.exit_code == 0 and "chosen as the earlier trials' results arrive" in result.stdout
    assert "  trial" not in result.stdout
    assert not state.sweeps_root().exists()


def test_a_trial_the_jobs_rules_refuse_fails_the_dry_run(tmp_path, home):
    tuning = {**TUNING, "ranges": {"max_steps": {"kind": "categorical", "values": [4, -1]}}}
    result = cli("tune", write(tmp_path, tuning=tuning), "--dry-run")
    assert result.exit_code == 2 and "hyperparameters.max_steps" in result.stderr


def test_status_of_a_damaged_sweep_is_an_exit_2_error(home):
    directory = state.sweep_dir("broken")
    directory.mkdir(parents=True)
    (directory / state.STATE).write_text("{not json")
    result = cli("status", "broken")
    assert result.exit_code == 2 and "is damaged" in result.stderr and "Traceback" not in result.output


SEED = ROOT / "configs" / "seed" / "p4d-cp8.yaml"  # a 1B-class model on ml.p4d.24xlarge, 16K tokens
SEED_TUNING = {"objective": {"metric": "train:loss", "type": "Minimize"}, "strategy": "Random", "max_jobs": 6,
               "max_parallel_jobs": 2,
               "ranges": {"lr": {"kind": "continuous", "min_value": 1e-5, "max_value": 1e-3,
                                 "scaling_type": "Logarithmic"},
                          "train_batch_size": {"kind": "integer", "min_value": 1, "max_value": 2}}}


def seed_sweep(tmp_path, top: int):
    tuning = {**SEED_TUNING, "ranges": {**SEED_TUNING["ranges"],
                                        "train_batch_size": {"kind": "integer", "min_value": 1, "max_value": top}}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"extends": str(SEED), "keep_alive_period_in_seconds": None, "tuning": tuning}))
    return path


def test_plan_prints_the_sweeps_cost_and_memory_and_starts_nothing(tmp_path, home):
    fits, too_big = cli("tune", seed_sweep(tmp_path, 2), "--plan"), cli("tune", seed_sweep(tmp_path, 64), "--plan")
    assert fits.exit_code == 0 and too_big.exit_code == 0, (fits.output, too_big.output)
    assert "6 trial(s), 2 at a time -> 3 round(s)" in fits.stdout and "every checked trial fits" in fits.stdout
    # the costliest trial is the largest batch, and only the 64-row one fails to fit
    assert "costliest trial: train_batch_size=2" in fits.stdout
    assert "costliest trial: train_batch_size=64" in too_big.stdout
    assert "do not fit: train_batch_size=64" in too_big.stdout
    assert not state.sweeps_root().exists()


def test_a_trial_predicted_out_of_memory_is_refused_unless_forced(tmp_path, home, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    refused = cli("tune", seed_sweep(tmp_path, 64))
    assert refused.exit_code == 2 and "predicted to run out of accelerator memory" in refused.stderr
    assert "train_batch_size=64" in refused.stderr
    forced = cli("tune", seed_sweep(tmp_path, 64), "--force", "--dry-run")
    assert forced.exit_code == 0, forced.output
    fits = cli("tune", seed_sweep(tmp_path, 2), "--dry-run")  # control: nothing to refuse, no warning
    assert fits.exit_code == 0 and "out of memory" not in fits.stderr


def test_backend_sagemaker_dry_run_prints_the_tuning_request(tmp_path, home, monkeypatch):
    import json

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    result = cli("tune", seed_sweep(tmp_path, 2), "--dry-run")
    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)
    config = request["HyperParameterTuningJobConfig"]
    assert config["ResourceLimits"] == {"MaxParallelTrainingJobs": 2, "MaxNumberOfTrainingJobs": 6}
    assert [r["Name"] for r in config["ParameterRanges"]["IntegerParameterRanges"]] == ["train_batch_size"]
    static = request["TrainingJobDefinition"]["StaticHyperParameters"]
    assert "lr" not in static and "train_batch_size" not in static and "max_steps" in static
    assert not state.sweeps_root().exists()


def test_a_backend_without_sweeps_is_told_so_by_name(tmp_path, home):
    """Kubernetes runs no sweeps: the error says that, not that it is a SageMaker tuning job."""
    job = write(tmp_path, tuning=TUNING, backend="kubernetes", image_uri="registry.example/smlaunch:1",
                kubernetes={"storage": {"pvc": "claim"}})
    result = cli("tune", job, "--dry-run")
    assert result.exit_code == 2, result.output
    assert 'backend = "kubernetes": runs no sweeps' in result.stderr and "SageMaker" not in result.stderr
    assert not state.sweeps_root().exists()
    assert cli("tune", write(tmp_path, tuning=TUNING), "--dry-run").exit_code == 0  # the control: local


HOSTILE = "acc\x1b]0;owned\x07[red]x[/red]"  # a window title in an escape sequence, and Rich markup


def test_status_prints_names_and_values_as_data_and_floats_short(home, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    trial = {"TrainingJobName": "names-001", "TrainingJobStatus": "Completed", "FinalObjective": 0.5,
             "TunedHyperParameters": {"lr": 0.0002529838120180263, HOSTILE: "adam", "layers": 4}}
    state.write(state.sweep_dir("names"), {
        "HyperParameterTuningJobName": "names", "Status": "Completed", "Backend": "local", "RandomSeed": 1,
        "Tuning": {"objective": {"metric": HOSTILE, "type": "Maximize"}}, "Trials": [trial],
        "BestTrainingJobName": "names-001"})
    result = cli("status", "names")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    # the hyperparameter's column and the objective's, and both in the best line
    assert result.output.count("acc\\x1b]0;owned\\x07[red]x[/red]") == 4
    assert "0.000252984" in result.output and "0.0002529838120180263" in result.output.splitlines()[-1]  # exact there
    row = next(line for line in result.output.splitlines() if "names-001 *" in line)
    assert "adam" in row and "│ 4 " in row  # control: a category and an integer as they are


def test_a_plot_names_each_trial_with_its_tuned_values(home):
    from launcher.backends.metric_records import JobMetrics
    from launcher.cli.metrics import _trial_labels
    from launcher.cli.metrics_view import plot

    state.write(state.sweep_dir("lr"), {
        "HyperParameterTuningJobName": "lr", "Status": "Completed", "Backend": "local", "RandomSeed": 1,
        "Tuning": {"objective": {"metric": "validation:loss", "type": "Minimize"}},
        "Trials": [{"TrainingJobName": "lr-001", "TrainingJobStatus": "Completed",
                    "TunedHyperParameters": {"lr": 0.0348578992891855, "opt": "adam"}}]})
    jobs = [JobMetrics(f"local:{name}", "metrics.jsonl", [{"step": 1, "loss": 2.0}]) for name in ("lr-001", "demo")]
    legend = plot(jobs, labels=_trial_labels(jobs)).axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["local:lr-001 (lr=0.0348579, opt=adam)",
                                                          "local:demo"]  # control: a job of no sweep
