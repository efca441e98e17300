"""Local mode end to end: `smlaunch submit --local` runs the SageMaker contract on this machine.

A job of 2 simulated hosts x 2 processes (world 4) with hybrid sharding and context parallelism
2 trains like one process on the same data; artifacts, status, logs and list work like
SageMaker's; failures, Ctrl-C and max_run end every process and are recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from container.toolkit.contract import read_training_env, sm_environment
from launcher.backends.base import BackendError
from launcher.config import validate_job
from launcher.local import store
from launcher.local.prepare import prepare
from launcher.local.process import ProcessRunner
from tests.support.local_jobs import (
    HP,
    HSD_CP,
    cli_env,
    job_file,
    members,
    processes_in,
    script_job,
    smlaunch,
    wait_for,
)
from tests.support.train_runs import ROOT, run_train, series


def test_two_hosts_with_hybrid_sharding_and_cp_train_like_one_process(tmp_path, demo_process_job):
    job = demo_process_job  # submitted once per test run (tests/support/demo_job.py); read here, not changed
    name, env = job.name, job.env()
    # the merged console log: every host's lines, each prefixed with its host
    assert "algo-1 | " in job.stdout and "algo-2 | " in job.stdout
    assert "algo-1 | [metrics] step=4 loss=" in job.stdout  # the rank's line as printed, after the host

    model = job.output / "model.tar.gz"
    output = job.output / "output.tar.gz"
    assert f"model artifact:  {model}" in job.stdout
    files = members(model)
    assert {"model.safetensors", "config.json"} <= set(files)
    assert json.loads(files["config.json"])["num_hidden_layers"] == 2
    records = [json.loads(x) for x in members(output)["metrics.jsonl"].decode().splitlines()]
    losses = series(records, "loss")
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert [r["step"] for r in records if "val_loss" in r] == [2, 4]

    # The seed's --checkpoint_dir /opt/ml/checkpoints lands in the job's shared directory.
    checkpoints = job.home / "jobs" / name / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-2", "step-4"]
    assert {p.name for p in (checkpoints / "step-4").glob("__*_0.distcp")} == {f"__{r}_0.distcp" for r in range(4)}

    # world 4 (2 data-parallel replicas x cp 2) trains exactly like one process
    reference = run_train(tmp_path / "ref", 1, **{**HP, "train_batch_size": 4}, training_dir=str(job.train))
    assert losses == pytest.approx(series(reference, "loss"), rel=1e-5)

    status = smlaunch("status", name, env=env)
    assert status.returncode == 0 and f"{name}: Completed\n" in status.stdout
    assert f"model artifacts: {model}" in status.stdout
    described = json.loads(smlaunch("status", name, "--json", env=env).stdout)
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == [
        "Starting", "Training", "Uploading", "Completed"]
    assert described["HostExitCodes"] == {"algo-1": 0, "algo-2": 0}
    assert "Restarts" not in described  # the control of test_restarts: a job without faults has none
    listed = smlaunch("list", "--local", env=job.env(COLUMNS="200"))
    assert name in listed.stdout and "Completed" in listed.stdout
    logs = smlaunch("logs", name, env=env)
    assert "algo-2 | " in logs.stdout and "[metrics] step=4" in logs.stdout
    assert (job.home / "jobs" / name / "logs" / "algo-2.log").read_text().count("[metrics]") == 0  # rank 0 logs


def test_runner_trees_give_the_toolkit_environment(tmp_path, home, corpus):
    """Each host's tree yields the SM_* values the sagemaker-training toolkit derives (docs/sagemaker-contract.md)."""
    train, validation = corpus
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "instance_count": 2, "processes_per_host": 2, "distribution": HSD_CP,
                        "hyperparameters": {"max_steps": 3, "model_preset": "llama3-tiny", "max_context_width": 64},
                        "inputs": {"train": str(train), "test": str(validation)}})
    spec = prepare(job, ProcessRunner(), job_name="trees", log=lambda _: None)
    for host in ("algo-1", "algo-2"):
        base = home / "jobs" / "trees" / "hosts" / host
        env = sm_environment(read_training_env(base, num_gpus=0))
        assert env["SM_CURRENT_HOST"] == host
        assert env["SM_HOSTS"] == '["algo-1","algo-2"]'
        assert env["SM_CURRENT_INSTANCE_TYPE"] == "local"
        assert env["SM_CHANNELS"] == '["test","train"]'
        assert env["SM_CHANNEL_TRAIN"] == f"{base}/input/data/train"
        assert (base / "input" / "data" / "train" / "train.jsonl").read_bytes() == (train / "train.jsonl").read_bytes()
        assert env["SM_MODEL_DIR"] == f"{base}/model"
        assert env["SM_OUTPUT_DATA_DIR"] == f"{base}/output/data"
        assert env["SM_HP_MAX_STEPS"] == "3" and env["SM_HP_MODEL_PRESET"] == "llama3-tiny"
        assert env["SM_HP_MP_PARAMETERS"] == '{"context_parallel_degree":2,"hybrid_shard_degree":2}'
        assert env["SM_MODULE_DIR"] == str(spec.source_archive)
        assert env["SM_NETWORK_INTERFACE_NAME"] == "lo"  # the hosts meet on 127.0.0.1
        assert env["SM_USER_ENTRY_POINT"] == "train.py"
        framework = json.loads(env["SM_FRAMEWORK_PARAMS"])
        assert framework["sagemaker_torch_distributed_enabled"] is True
        assert framework["sagemaker_smlaunch_processes_per_host"] == 2
        assert json.loads(env["SM_USER_ARGS"]) == ["--max_context_width", "64", "--max_steps", "3",
                                                   "--model_preset", "llama3-tiny", "--mp_parameters",
                                                   "context_parallel_degree=2,hybrid_shard_degree=2"]
    record = store.read("trees")
    assert record["TrainingJobStatus"] == "InProgress" and record["ProcessesPerHost"] == 2
    with tarfile.open(spec.source_archive) as tar:  # the code SageMaker would get, the runtime under _smlaunch/
        names = set(tar.getnames())
    assert {"train.py", "_smlaunch/container/toolkit/bootstrap.py",
            "_smlaunch/launcher/wire/training/__init__.py"} <= names


# The toolkit's trainer fetches the code with files.download_and_extract(env.module_dir,
# environment.code_dir) (entry_point.run); computed in a process of its own, as it reads
# SAGEMAKER_BASE_DIR when imported.
TOOLKIT_FETCH = """
from sagemaker_training import environment, files
files.download_and_extract(uri=environment.Environment().module_dir, path=environment.code_dir)
"""


def test_the_toolkit_fetches_the_code_of_a_local_tree(tmp_path, home, corpus):
    """AWS's toolkit, run on a tree the process runner wrote, puts the code where our bootstrap does."""
    pytest.importorskip("sagemaker_training")
    from container.toolkit.code import fetch_code

    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "instance_count": 2, "hyperparameters": HP, "inputs": {"train": str(corpus[0])}})
    prepare(job, ProcessRunner(), job_name="fetch", log=lambda _: None)
    theirs, ours = (home / "jobs" / "fetch" / "hosts" / host for host in ("algo-1", "algo-2"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
    proc = subprocess.run([sys.executable, "-c", TOOLKIT_FETCH], env={**env, "SAGEMAKER_BASE_DIR": str(theirs)},
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    fetch_code(read_training_env(ours, num_gpus=0))
    assert (theirs / "code" / "train.py").read_bytes() == (ROOT / "entrypoints" / "train.py").read_bytes()
    # the bundled runtime, where train.py imports it from
    assert (theirs / "code" / "_smlaunch" / "container" / "toolkit" / "bootstrap.py").is_file()
    listing = [sorted(str(p.relative_to(base / "code")) for p in (base / "code").rglob("*")) for base in (theirs, ours)]
    assert listing[0] == listing[1]


def test_a_used_job_name_is_refused_and_nothing_is_written(tmp_path, home, corpus):
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "hyperparameters": HP, "inputs": {"train": str(corpus[0])}})
    prepare(job, ProcessRunner(), job_name="taken", log=lambda _: None)
    before = (home / "jobs" / "taken" / "job.json").read_text()
    with pytest.raises(BackendError, match="job_name 'taken' is already used by a local job"):
        prepare(job, ProcessRunner(), job_name="taken", log=lambda _: None)
    assert (home / "jobs" / "taken" / "job.json").read_text() == before


def test_local_gpu_without_a_gpu_is_a_clear_error(home, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                        "instance_type": "local_gpu", "hyperparameters": HP})
    with pytest.raises(BackendError, match="no NVIDIA GPU found.*instance_type: local"):
        prepare(job, ProcessRunner(), job_name="gpu", log=lambda _: None)
    assert not (home / "jobs" / "gpu").exists()


def test_local_paths_are_checked_before_anything_runs(tmp_path, home):
    (tmp_path / "out").write_text("a file")
    spec = job_file(tmp_path / "job.yaml", inputs={"train": str(tmp_path / "missing")},
                    output_path=str(tmp_path / "out"))
    proc = smlaunch("submit", str(spec), env=cli_env(home))
    assert proc.returncode == 2
    assert "inputs.train" in proc.stderr and "no such file or directory" in proc.stderr
    assert "output_path" in proc.stderr and "is a file, not a directory" in proc.stderr
    assert not (home / "jobs").exists()


# --- failures, stops and signals ------------------------------------------------------------









def test_a_failing_host_fails_the_job_with_its_reason(tmp_path, home):
    env = cli_env(home)
    spec = script_job(tmp_path, environment={"FAIL_RANK": "1"}, base_job_name="fails")
    proc = smlaunch("submit", str(spec), env=env, timeout=180)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the failure report once, in the host's lines; the supervisor's line and the error name it
    assert "ValueError: boom on rank 1" in proc.stdout
    assert (proc.stdout + proc.stderr).count("ExitCode 1") == 1, proc.stdout[-3000:] + proc.stderr
    assert "smlaunch | failed: AlgorithmError: algo-2: ExecuteUserScriptError (the report of algo-2 above)" \
        in proc.stdout
    assert "failed: AlgorithmError: algo-2: ExecuteUserScriptError (the whole report is in the job's output " \
           "above)" in proc.stderr
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    status = smlaunch("status", name, env=env)
    assert f"{name}: Failed\n" in status.stdout
    assert "failure reason: AlgorithmError: algo-2: ExecuteUserScriptError:\nExitCode 1\n" \
           'ErrorMessage "rank 1 (host algo-2, local rank 0) exited with code 1' in status.stdout
    assert "ValueError: boom on rank 1" in status.stdout
    record = store.read(name)
    assert record["HostExitCodes"]["algo-2"] == 1 and record["HostExitCodes"]["algo-1"] != 0  # stopped
    assert "ModelArtifacts" not in record and Path(record["OutputArtifacts"]["output.tar.gz"]).is_file()
    assert processes_in(home / "jobs" / name) == []


def test_ctrl_c_stops_every_host_and_leaves_no_process(tmp_path, home):
    spec = script_job(tmp_path, base_job_name="sigint")
    cli = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", str(spec)], env=cli_env(home),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = wait_for(lambda: next((home / "jobs").glob("sigint-*"), None) if (home / "jobs").is_dir() else None)
    log = job / "logs" / "job.log"
    wait_for(lambda: log.is_file() and log.read_text().count(" ready") == 2)
    assert len(processes_in(job)) >= 6  # 2 bootstraps, 2 torchruns, 2 ranks
    cli.send_signal(signal.SIGINT)
    stdout, stderr = cli.communicate(timeout=150)
    assert cli.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert processes_in(job) == []
    record = store.read(job.name)
    assert record["TrainingJobStatus"] == "Stopped" and record["SecondaryStatus"] == "Stopped"
    assert "SIGINT: stopping every host" in log.read_text()


def test_max_run_stops_the_job(tmp_path, home):
    env = cli_env(home)
    spec = script_job(tmp_path, max_run=4, instance_count=1, base_job_name="slow")
    started = time.monotonic()
    proc = smlaunch("submit", str(spec), env=env, timeout=150)
    assert proc.returncode == 1 and time.monotonic() - started < 100
    assert "stopped: MaxRuntimeExceeded: the job ran longer than max_run (4 s)" in proc.stderr
    record = store.list_jobs(home / "jobs")[0]
    assert record["TrainingJobStatus"] == "Stopped" and record["SecondaryStatus"] == "MaxRuntimeExceeded"


def test_no_wait_then_logs_and_stop(tmp_path, home):
    env = cli_env(home)
    spec = script_job(tmp_path, instance_count=1, base_job_name="detached")
    proc = smlaunch("submit", str(spec), "--no-wait", env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    job = home / "jobs" / name
    wait_for(lambda: (job / "logs" / "job.log").is_file() and " ready" in (job / "logs" / "job.log").read_text())
    assert "InProgress (Training)" in smlaunch("status", name, env=env).stdout
    stop = smlaunch("stop", name, env=env)
    assert stop.returncode == 0 and f"stopping {name}" in stop.stdout
    follow = smlaunch("logs", name, "--follow", "--poll", "0.2", env=env, timeout=150)
    assert "algo-1 | rank 0 on algo-1 ready" in follow.stdout
    assert follow.returncode == 1 and "stopped" in follow.stderr  # following a stopped job ends like wait()
    assert store.read(name)["TrainingJobStatus"] == "Stopped"
    wait_for(lambda: processes_in(job) == [], timeout=30)


def test_estimator_fit_runs_locally_and_attach_follows(tmp_path, home):
    from launcher import PyTorch

    src = tmp_path / "src"
    src.mkdir()
    (src / "job.py").write_text(
        "import os, sys\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'weights.txt'), 'w').write(' '.join(sys.argv[1:]))\n"
        "print('trained on', os.environ['SM_CURRENT_HOST'], flush=True)\n")
    est = PyTorch(entry_point="job.py", source_dir=str(src), instance_type="local", instance_count=1,
                  hyperparameters={"epochs": 2}, base_job_name="est")
    est.fit(job_name="est-1")
    model = Path(est.model_data)
    assert model == home / "jobs" / "est-1" / "output" / "model.tar.gz"
    assert members(model) == {"weights.txt": b"--epochs 2"}
    assert est.describe()["TrainingJobStatus"] == "Completed"
    attached = PyTorch.attach("est-1")
    assert attached.config.hyperparameters.raw() == {"epochs": 2}
    assert attached.config.instance_type == "local" and attached.model_data == str(model)
    assert "algo-1 | trained on algo-1" in (home / "jobs" / "est-1" / "logs" / "job.log").read_text()
