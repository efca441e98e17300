"""A sweep is validated before any trial runs (launcher.config.tuning_rules): every trial is a job
of the same validated kind, checked at the ranges' extremes and every categorical value; the
sweep's plan (launcher.plan.tuning) takes the worst of them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from launcher.config import ConfigError
from launcher.config.jobfile import validate_job_file
from launcher.plan.tuning import plan_sweep

SEED = Path(__file__).resolve().parents[2] / "configs" / "seed"


def sweep_file(tmp_path: Path, ranges: dict, *, seed: str = "p4d-no-cp", metric: str = "validation:loss",
               **job) -> Path:
    """A seed run (smlaunch's runtime, 8 x A100 per host) with a tuning: section."""
    data = {"extends": str(SEED / f"{seed}.yaml"), **job,
            "tuning": {"objective": {"metric": metric, "type": "Minimize"}, "ranges": ranges, "max_jobs": 4}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def errors(tmp_path, ranges, **kw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate_job_file(sweep_file(tmp_path, ranges, **kw))
    return [str(i) for i in info.value.issues]


LR = {"kind": "continuous", "min_value": 1e-5, "max_value": 1e-3, "scaling_type": "Logarithmic"}


def test_a_sweep_whose_trials_are_all_valid_passes_with_its_warnings(tmp_path):
    job = validate_job_file(sweep_file(tmp_path, {"lr": LR}))  # control
    assert job.config.tuning.ranges["lr"].max_value == 1e-3
    static = [str(w) for w in job.warnings if w.path == "tuning.ranges.lr"]
    assert len(static) == 1 and "also a static hyperparameter" in static[0]  # the seed sets lr


def test_fp8_on_an_a100_names_the_value_that_fails(tmp_path):
    found = errors(tmp_path, {"fp8": {"kind": "categorical", "values": [False, True]}})
    assert len(found) == 1
    assert found[0].startswith('tuning.ranges.fp8 = ["fp8=True"]: would make trials that are invalid jobs')
    assert "A100" in found[0] and "fp8=False" not in found[0]


def test_a_degree_only_some_trials_can_use_is_an_error(tmp_path):
    found = errors(tmp_path, {"context_parallel_degree": {"kind": "categorical", "values": [1, 3]}})
    assert len(found) == 1 and "context_parallel_degree=3 fails" in found[0]
    assert "context_parallel_degree=1" not in found[0]


def test_a_name_the_runtime_does_not_read_gets_a_did_you_mean(tmp_path):
    found = errors(tmp_path, {"lrr": LR})
    assert found == ['tuning.ranges.lrr = "lrr": is not a hyperparameter smlaunch\'s train.py reads, so every '
                     "trial would train alike; did you mean 'lr'?"]


def test_a_hugging_face_name_gets_smlaunchs_name_not_the_nearest_spelling(tmp_path):
    found = errors(tmp_path, {"learning_rate": LR})
    assert found == ['tuning.ranges.learning_rate = "learning_rate": is not a hyperparameter smlaunch\'s train.py '
                     "reads, so every trial would train alike; did you mean 'lr'? (learning_rate is Hugging Face's "
                     "name, its Trainer's or TRL's; smlaunch's train.py reads lr)"]
    batch = {"kind": "integer", "min_value": 1, "max_value": 2}
    assert "did you mean 'train_batch_size'? (per_device_train_batch_size is Hugging Face's" in errors(
        tmp_path, {"per_device_train_batch_size": batch})[0]


def test_an_extending_files_ranges_replace_the_bases(tmp_path):
    base = sweep_file(tmp_path, {"lr": LR})
    (tmp_path / "warmup.yaml").write_text(yaml.safe_dump({"extends": str(base), "tuning": {
        "ranges": {"warmup": {"kind": "continuous", "min_value": 0.0, "max_value": 0.1}}, "max_jobs": 2}}))
    tuning = validate_job_file(tmp_path / "warmup.yaml").config.tuning
    assert list(tuning.ranges) == ["warmup"]  # the base's lr is not tuned as well
    assert (tuning.max_jobs, tuning.objective.metric) == (2, "validation:loss")  # control: the rest still merges


def test_a_continuous_range_of_a_whole_number_is_an_error_an_integer_range_of_a_float_is_not(tmp_path):
    found = errors(tmp_path, {"train_batch_size": {"kind": "continuous", "min_value": 1, "max_value": 2}})
    assert len(found) == 1 and "use an IntegerParameter" in found[0]
    validate_job_file(sweep_file(tmp_path, {"lr": {"kind": "integer", "min_value": 1, "max_value": 2}}))


def test_reserved_names_and_an_unknown_objective_are_errors(tmp_path):
    found = errors(tmp_path, {"sagemaker_program": {"kind": "categorical", "values": ["a.py"]}})
    assert len(found) == 1 and "reserves for itself" in found[0]
    found = errors(tmp_path, {"lr": LR}, metric="val:loss")
    assert len(found) == 1 and found[0].startswith('tuning.objective.metric = "val:loss": is not among')
    assert "did you mean 'validation:loss'" in found[0]


def test_a_user_script_needs_metric_definitions_for_its_objective(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "cifar.py").write_text("print('acc=1')\n")
    job = {"entry_point": "cifar.py", "source_dir": str(code), "instance_type": "ml.g5.xlarge", "region": "us-east-1",
           "framework_version": "2.5.1", "py_version": "py311",
           "hyperparameters": {"lr": 0.1},
           "tuning": {"objective": {"metric": "acc", "type": "Maximize"}, "max_jobs": 2,
                      "ranges": {"lr": {"kind": "continuous", "min_value": 0.01, "max_value": 0.2}}}}
    path = tmp_path / "user.yaml"
    path.write_text(yaml.safe_dump(job))
    with pytest.raises(ConfigError, match="has no metric_definitions"):
        validate_job_file(path)
    job["metric_definitions"] = [{"Name": "acc", "Regex": "acc=([0-9.]+)"}]
    path.write_text(yaml.safe_dump(job))
    assert validate_job_file(path).config.tuning.objective.metric == "acc"


def test_the_plan_takes_the_worst_trial_and_says_which_do_not_fit(tmp_path):
    ranges = {"train_batch_size": {"kind": "integer", "min_value": 1, "max_value": 64}}
    job = validate_job_file(sweep_file(tmp_path, ranges))
    sweep = plan_sweep(job, job.config.tuning)
    small, big = (t for t in sweep.trials)
    assert small.values == {"train_batch_size": 1} and big.values == {"train_batch_size": 64}
    assert small.result.fits is True and big.result.fits is False
    assert sweep.fits is False and sweep.costliest is big
    assert sweep.rounds == 4  # max_jobs 4, one at a time
    assert math.isclose(sweep.usd, big.usd * 4, rel_tol=1e-12)
    assert math.isclose(sweep.seconds, big.seconds * 4, rel_tol=1e-12)
    report = sweep.report()
    assert "costliest trial: train_batch_size=64" in report and "do not fit: train_batch_size=64" in report


def test_the_plan_of_parallel_trials_counts_rounds(tmp_path):
    path = sweep_file(tmp_path, {"lr": LR})
    data = yaml.safe_load(path.read_text())
    data["tuning"].update(max_jobs=5, max_parallel_jobs=2)
    path.write_text(yaml.safe_dump(data))
    job = validate_job_file(path)
    sweep = plan_sweep(job, job.config.tuning)
    assert sweep.rounds == 3 and sweep.fits is True
    assert math.isclose(sweep.seconds, sweep.costliest.seconds * 3, rel_tol=1e-12)


def test_validate_prints_the_sweeps_size_and_refuses_a_bad_trial_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from launcher.cli.app import main

    good = CliRunner().invoke(main, ["validate", str(sweep_file(tmp_path, {"lr": LR}))], catch_exceptions=False)
    assert good.exit_code == 0
    assert "sweep                4 trial(s), 1 at a time, Bayesian over 1 hyperparameter(s) (lr)" in good.output
    bad = CliRunner().invoke(main, ["validate", str(sweep_file(tmp_path, {"fp8": {
        "kind": "categorical", "values": [False, True]}}))], catch_exceptions=False)
    assert bad.exit_code == 2 and "fp8=True fails" in bad.output and "Traceback" not in bad.output
