"""A sweep on Slurm (tests/support/slurm_cluster.py's cluster): 2 trials of the tiny model over `lr`,
each an ordinary Slurm job of smlaunch's (`status` knows it), 2 at a time; the best is the trial
with the lower validation loss in its own metrics.jsonl. Local sweeps: tests/integration/test_tune.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.local_jobs import cli_env, smlaunch
from tests.support.metrics_cli import ONE_PROCESS, RUN_HP, jsonl
from tests.support.train_runs import ROOT


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def test_a_sweep_of_two_trials_on_slurm(tmp_path, home, corpus, slurm_cluster):
    train, validation = corpus
    env = {**cli_env(home), **slurm_cluster.env}
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({
        "entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
        "backend": "slurm", "slurm": {"partition": slurm_cluster.partition, "time": "10:00"},
        "instance_count": 1, "processes_per_host": 1, "distribution": ONE_PROCESS,
        "inputs": {"train": str(train), "validation": str(validation)}, "hyperparameters": RUN_HP,
        "tuning": {"objective": {"metric": "validation:loss", "type": "Minimize"}, "strategy": "Grid",
                   "max_parallel_jobs": 2, "ranges": {"lr": {"kind": "categorical", "values": [0.0003, 0.03]}}}}))
    proc = smlaunch("tune", str(spec), "--name", "slurm-sweep", env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    desc = json.loads(smlaunch("status", "slurm-sweep", "--json", env=env).stdout)
    assert desc["Backend"] == "slurm" and desc["HyperParameterTuningJobStatus"] == "Completed"
    last_val = {}
    for trial in desc["TrainingJobs"]:
        name = trial["TrainingJobName"]
        record = json.loads(smlaunch("status", f"slurm:{name}", "--json", env=env).stdout)
        assert record["TrainingJobStatus"] == "Completed" and record.get("SlurmJobId")
        last_val[name] = [r["val_loss"] for r in jsonl(home, name) if "val_loss" in r][-1]
        assert trial["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == last_val[name]
    assert len(last_val) == 2 and len(set(last_val.values())) == 2  # control: two different losses
    assert desc["BestTrainingJob"]["TrainingJobName"] == min(last_val, key=last_val.get)
