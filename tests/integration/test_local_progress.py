"""A running local job of smlaunch's own trainer: `status` shows its step and ETA from the
trainer's progress file; stopped, it reads Stopped, names the checkpoint the stop saved and
claims no model.tar.gz (nothing was exported); `list` fits 80 columns. With asynchronous
checkpoints the stop's save is written in the background and committed before the ranks leave, and
the job's MLflow run reads KILLED (stopped, to be resumed), not RUNNING."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.support.local_jobs import cli_env, processes_in, smlaunch, wait_for
from tests.support.trackers import wandb_records
from tests.support.train_runs import ROOT

# Far more steps than the test waits for: the job is stopped while it runs.
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 1_000_000,
      "train_batch_size": 2, "logging_freq": 20, "checkpoint_freq": 1_000_000, "checkpoint_dir": "/opt/ml/checkpoints"}


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_status_of_a_running_job_then_of_the_stopped_job(tmp_path, home, async_mode, monkeypatch):  # noqa: F811
    spec = tmp_path / "job.yaml"
    store = tmp_path / "mlruns"
    hyperparameters = {**HP, "checkpoint_async_mode": async_mode}
    environment = {}
    if async_mode == "async":
        pytest.importorskip("mlflow", reason="MLflow (smlaunch[mlflow]) is not installed")
        pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
        hyperparameters.update(mlflow_tracking_uri=store.as_uri(), wandb_project="smlaunch-tests")
        (tmp_path / "wandb").mkdir()
        environment.update(MLFLOW_ALLOW_FILE_STORE="true",  # MLflow 3 keeps its file store behind this
                           WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb"))
    spec.write_text(yaml.safe_dump({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                                    "instance_type": "local", "instance_count": 1, "processes_per_host": 2,
                                    "distribution": {"torch_distributed": {"enabled": True}},  # torchrun, 2 ranks
                                    "hyperparameters": hyperparameters, "environment": environment}))
    env = cli_env(home)
    submitted = smlaunch("submit", str(spec), "--no-wait", "--job-name", "live-progress", env=env, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = home / "jobs" / "live-progress"
    progress_file = job / "hosts" / "algo-1" / "output" / "data" / "progress.json"
    wait_for(lambda: progress_file.is_file() and json.loads(progress_file.read_text())["step"] >= 40, timeout=90)

    running = smlaunch("status", "live-progress", env=env)
    assert running.returncode == 0, running.stderr
    match = re.search(r"progress: step (\d+)/1000000 \(\d+%\), loss [\d.]+, [\d,]+ tokens/s, ETA (\d+):\d\d:\d\d",
                      running.stdout)
    assert "live-progress: InProgress (Training)" in running.stdout and match, running.stdout
    assert int(match.group(1)) % 20 == 0  # a logged step
    shown = json.loads(smlaunch("status", "live-progress", "--json", env=env).stdout)["Progress"]
    assert shown["max_steps"] == 1_000_000 and shown["step"] >= int(match.group(1)) and shown["eta_s"] > 0

    stop = smlaunch("stop", "live-progress", env=env)
    assert stop.returncode == 0, stop.stderr
    wait_for(lambda: json.loads((job / "job.json").read_text())["TrainingJobStatus"] != "InProgress", timeout=120)
    log = (job / "logs" / "job.log").read_text()
    saved = int(re.search(r"SIGTERM: saved a checkpoint at step (\d+) and stopping", log).group(1))
    # a stop is no crash: said once, without torch elastic's SignalException traceback
    assert log.count("SIGTERM: saved a checkpoint at step") == 1, log[-6000:]
    assert "Traceback" not in log and "SignalException" not in log, log[-6000:]

    stopped = smlaunch("status", "live-progress", env=env)
    assert "live-progress: Stopped\n" in stopped.stdout, stopped.stdout
    assert f"last checkpoint: step {saved}, {job / 'checkpoints' / f'step-{saved}'}" in stopped.stdout
    # the stop's save, asynchronous or not, is whole: committed (marker) and nothing left half-written
    assert (job / "checkpoints" / f"step-{saved}" / ".complete").is_file()
    assert not list((job / "checkpoints").glob("step-*.tmp"))
    if async_mode == "async":
        assert re.search(rf"saved checkpoint \S*/step-{saved} \(written in the background\)", log), log[-3000:]
        import mlflow

        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading the store back, here
        client = mlflow.MlflowClient(tracking_uri=store.as_uri())
        (run,) = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
        assert run.info.status == "KILLED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps and max(steps) <= saved
        logged = wandb_records(tmp_path / "wandb")  # W&B: preempting (to be resumed), then finished cleanly
        assert [r["type"] for r in logged if r["type"] in ("preempting", "exit")] == ["preempting", "exit"]
        assert next(r["exit"]["exit_code"] for r in logged if r["type"] == "exit") == 0
    else:  # control: a synchronous save says nothing of the background
        assert "saved checkpoint" in log and "(written in the background)" not in log
    assert "last step: step " in stopped.stdout and "ETA" not in stopped.stdout
    assert "failure reason" not in stopped.stdout and "model artifacts" not in stopped.stdout
    assert "failed" not in log
    assert log.count("[smlaunch] stopped (exit code 143): received SIGTERM and forwarded it to every rank") == 1
    record = json.loads((job / "job.json").read_text())
    assert "FailureReason" not in record and set(record["OutputArtifacts"]) == {"output.tar.gz"}
    assert not (job / "output" / "model.tar.gz").exists()

    listed = smlaunch("list", "--local", env={**env, "COLUMNS": "80"})
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and any("local:live-progress" in line for line in lines)
    assert any(re.search(r"local:live-progress\s+Stopped\s+\d+%\s+\d\d-\d\d \d\d:\d\d\s+\d+:\d\d:\d\d$", line)
               for line in lines), listed.stdout
    wait_for(lambda: processes_in(job) == [], timeout=30)

