"""A running local job of smlaunch's own trainer: `status` shows its step and ETA from the
trainer's progress file; stopped, it reads Stopped, names the checkpoint the stop saved and
claims no model.tar.gz (nothing was exported); `list` fits 80 columns."""

from __future__ import annotations

import json
import re

import yaml

from tests.support.local_jobs import cli_env, processes_in, smlaunch, wait_for
from tests.support.train_runs import ROOT

# Far more steps than the test waits for: the job is stopped while it runs.
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 1_000_000,
      "train_batch_size": 2, "logging_freq": 20, "checkpoint_freq": 1_000_000, "checkpoint_dir": "/opt/ml/checkpoints"}


def test_status_of_a_running_job_then_of_the_stopped_job(tmp_path, home):  # noqa: F811
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                                    "instance_type": "local", "instance_count": 1, "processes_per_host": 1,
                                    "hyperparameters": HP}))
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

    stopped = smlaunch("status", "live-progress", env=env)
    assert "live-progress: Stopped\n" in stopped.stdout, stopped.stdout
    assert f"last checkpoint: step {saved}, {job / 'checkpoints' / f'step-{saved}'}" in stopped.stdout
    assert "last step: step " in stopped.stdout and "ETA" not in stopped.stdout
    assert "failure reason" not in stopped.stdout and "model artifacts" not in stopped.stdout
    assert "failed" not in log and "exit code 143" not in log
    record = json.loads((job / "job.json").read_text())
    assert "FailureReason" not in record and set(record["OutputArtifacts"]) == {"output.tar.gz"}
    assert not (job / "output" / "model.tar.gz").exists()

    listed = smlaunch("list", "--local", env={**env, "COLUMNS": "80"})
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and any("local:live-progress" in line for line in lines)
    assert any(re.search(r"local:live-progress\s+Stopped\s+\d\d-\d\d \d\d:\d\d\s+\d+:\d\d:\d\d$", line)
               for line in lines), listed.stdout
    wait_for(lambda: processes_in(job) == [], timeout=30)

