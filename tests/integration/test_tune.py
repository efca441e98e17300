"""Local sweeps for real (`smlaunch tune`): 4 trials of the tiny model over `lr`, 2 at a time,
find the trial with the best validation loss, and the sweep's table is the trials' own metrics;
`smlaunch stop` of a detached sweep stops its running trials (each records why) and its controller.

Expected values are read independently of launcher.tune: from each trial's metrics.jsonl (rank 0's
records) and job record. The unit tests are tests/unit/test_tune_*.py."""

from __future__ import annotations

import json

import yaml

from launcher.local import identity
from tests.support.local_jobs import cli_env, job_file, processes_in, smlaunch, wait_for
from tests.support.metrics_cli import ONE_PROCESS, RUN_HP, jsonl

LRS = [0.0003, 0.003, 0.03, 0.3]


def test_a_local_grid_sweep_finds_the_best_validation_loss(tmp_path, home, corpus):  # noqa: F811 - fixtures
    train, validation = corpus
    spec = job_file(tmp_path / "sweep.yaml", instance_count=1, processes_per_host=1, distribution=ONE_PROCESS,
                    inputs={"train": str(train), "validation": str(validation)}, hyperparameters=RUN_HP,
                    tuning={"objective": {"metric": "validation:loss", "type": "Minimize"}, "strategy": "Grid",
                            "max_parallel_jobs": 2, "ranges": {"lr": {"kind": "categorical", "values": LRS}}})
    env = cli_env(home)
    proc = smlaunch("tune", str(spec), "--name", "lr-grid", env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    desc = json.loads(smlaunch("status", "lr-grid", "--json", env=env).stdout)
    trials = {t["TrainingJobName"]: t for t in desc["TrainingJobs"]}
    assert sorted(trials) == [f"lr-grid-00{i}" for i in range(1, 5)]
    # each trial is an ordinary job with its value set; its objective is its own last validation loss
    last_val = {}
    for name, trial in trials.items():
        record = json.loads((home / "jobs" / name / "job.json").read_text())
        assert record["TrainingJobStatus"] == "Completed"
        assert float(record["HyperParameters"]["lr"]) == float(trial["TunedHyperParameters"]["lr"])
        last_val[name] = [r["val_loss"] for r in jsonl(home, name) if "val_loss" in r][-1]
        assert trial["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == last_val[name]
    assert {float(t["TunedHyperParameters"]["lr"]) for t in trials.values()} == set(LRS)
    best = min(last_val, key=last_val.get)
    assert desc["BestTrainingJob"]["TrainingJobName"] == best
    assert desc["HyperParameterTuningJobStatus"] == "Completed"
    assert desc["TrainingJobStatusCounters"]["Completed"] == 4
    # control: the losses differ, so finding the best means something
    assert len(set(last_val.values())) == 4

    # the table that `tune` and `status` print: one row per trial, its objective to 6 significant digits
    table = smlaunch("status", "lr-grid", env=env).stdout
    for name, value in last_val.items():
        row = next(line for line in table.splitlines() if f"│ {name}" in line)
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert cells[0] == name + (" *" if name == best else "") and cells[1] == "Completed"
        assert abs(float(cells[3]) - value) <= 5e-6 * abs(value)  # %.6g: half a unit of the 6th digit
    listed = smlaunch("list", "--tuning", env=env).stdout
    assert "lr-grid" in listed and best in listed

    # a job file with a tuning section is a sweep, never one job
    refused = smlaunch("submit", str(spec), env=env)
    assert refused.returncode == 2 and "smlaunch tune" in refused.stderr
    assert yaml.safe_load(spec.read_text())["tuning"]["strategy"] == "Grid"


def test_stop_of_a_detached_sweep_stops_its_running_trials(tmp_path, home, corpus):  # noqa: F811 - fixtures
    train, validation = corpus
    spec = job_file(tmp_path / "long.yaml", instance_count=1, processes_per_host=1, distribution=ONE_PROCESS,
                    inputs={"train": str(train), "validation": str(validation)},
                    hyperparameters={**RUN_HP, "max_steps": 100000},
                    tuning={"objective": {"metric": "validation:loss", "type": "Minimize"}, "strategy": "Random",
                            "random_seed": 3, "max_jobs": 4, "max_parallel_jobs": 2,
                            "ranges": {"lr": {"kind": "continuous", "min_value": 0.001, "max_value": 0.01}}})
    env = cli_env(home)
    proc = smlaunch("tune", str(spec), "--name", "long", "--detach", env=env)
    assert proc.returncode == 0 and "started tuning job long (detached)" in proc.stdout, proc.stderr

    def running() -> bool:
        desc = json.loads(smlaunch("status", "long", "--json", env=env).stdout)
        return desc["TrainingJobStatusCounters"]["InProgress"] == 2 and all(
            (home / "jobs" / t["TrainingJobName"] / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl").exists()
            for t in desc["TrainingJobs"])

    wait_for(running, timeout=120)
    stopped = smlaunch("stop", "long", env=env)
    assert stopped.returncode == 0 and "stopping tuning job long" in stopped.stdout
    wait_for(lambda: json.loads(smlaunch("status", "long", "--json", env=env).stdout)[
        "HyperParameterTuningJobStatus"] == "Stopped", timeout=180)
    desc = json.loads(smlaunch("status", "long", "--json", env=env).stdout)
    assert [t["TrainingJobStatus"] for t in desc["TrainingJobs"]] == ["Stopped", "Stopped"]  # no third started
    for trial in desc["TrainingJobs"]:
        record = json.loads((home / "jobs" / trial["TrainingJobName"] / "job.json").read_text())
        assert record["TrainingJobStatus"] == "Stopped"
        assert record["StopReason"] == "Stopped with its tuning job: Stopped by the user"
    assert processes_in(home) == []  # the supervisors and the ranks have all ended, and the controller:
    controller = json.loads((home / "tuning" / "long" / "sweep.json").read_text())["ControllerProcess"]
    wait_for(lambda: not identity.is_running(controller), timeout=30)
    again = smlaunch("stop", "long", env=env)
    assert again.returncode == 1 and "has already ended (Stopped)" in again.stderr
