"""Metrics trackers, the multi-process half: train.py on two gloo ranks sends metrics.jsonl's
records to Weights & Biases (offline: a local .wandb file, read back with W&B's own reader,
`wandb leet inspect --json`) and to MLflow (a file store, read back with MlflowClient), from rank 0
only, with the job's name and its hyperparameters (secrets masked) as the run's configuration; a
local job's trackers write no secret of its hyperparameters in any file; and an unreachable MLflow
server is a warning, or with metrics_required the job's error before training.
The in-process half is tests/unit/test_trackers.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.wire.opt_ml import free_port
from tests.support.local_jobs import cli_env, smlaunch
from tests.support.trackers import wandb_records, wandb_runs
from tests.support.train_runs import ROOT, run_train

JOB = "trackers-job-1"
SECRET = "hf_notForTrackers123"


def series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as the trackers name its series: train/<key>, validation/loss; numbers only
    (a record's text, such as the ledger's loop_start, is no series)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault("validation/loss" if key == "val_loss" else f"train/{key}", []).append(
                    (record["step"], value))
    return out


def wandb_series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record["type"] == "history":
            step = record["history"]["step"]["num"]
            for name, value in record["history"]["item"].items():
                if not name.startswith("_"):  # W&B's own: _step, _runtime, _timestamp
                    out.setdefault(name, []).append((step, value))
    return out


@pytest.fixture
def tracker_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINING_JOB_NAME", JOB)  # as SageMaker (and smlaunch's docker runner) sets it
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this
    monkeypatch.delenv("TRAINING_JOB_ARN", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the ranks' temporary directory, looked at after
    (tmp_path / "wandb").mkdir()
    (tmp_path / "tmp").mkdir()


def test_wandb_offline_and_mlflow_file_store_get_the_records_of_metrics_jsonl(tmp_path, tracker_env, corpus):
    pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
    mlflow = pytest.importorskip("mlflow", reason="MLflow (smlaunch[mlflow]) is not installed")
    train, validation = corpus
    store = tmp_path / "mlruns"
    records = run_train(tmp_path / "run", 2, max_steps=4, dataset_type="jsonl", training_dir=str(train),
                        test_dir=str(validation), validation_freq=2, validation_batches=1,
                        wandb_project="smlaunch-tests", wandb_tags="ci,tiny", mlflow_tracking_uri=store.as_uri(),
                        mlflow_experiment_name="trackers", hf_token=SECRET)
    expected = series(records)
    assert {"train/loss", "train/grad_norm", "train/lr", "train/tokens_per_s", "train/peak_memory_gib",
            "validation/loss"} <= set(expected)
    assert [s for s, _ in expected["validation/loss"]] == [2, 4]

    logged = wandb_records(tmp_path / "wandb")
    run = next(r["run"] for r in logged if r["type"] == "run")
    assert (run["display_name"], run["project"], run["tags"]) == (JOB, "smlaunch-tests", ["ci", "tiny"])
    config = run["config"]["update"]
    assert (config["max_steps"], config["lr"], config["hf_token"]) == (4, 0.03, "****")
    assert config["smlaunch"] == {"job_name": JOB, "world_size": 2}
    assert wandb_series(logged) == expected  # every series, step for step, value for value
    assert [r["exit"]["exit_code"] for r in logged if r["type"] == "exit"] == [0]  # finished

    client = mlflow.MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name("trackers")
    (found,) = client.search_runs([experiment.experiment_id])  # rank 0 only
    assert (found.info.run_name, found.info.status) == (JOB, "FINISHED")
    assert (found.data.params["max_steps"], found.data.params["hf_token"]) == ("4", "****")
    assert found.data.tags["smlaunch.job_name"] == JOB
    assert {name: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, name)]
            for name in found.data.metrics} == expected
    assert SECRET not in json.dumps(logged)  # neither in the config nor in the command line W&B records
    assert "****" in next(r["environment"]["args"] for r in logged if r["type"] == "environment")
    # wandb's import made its temporary directories there (tmp*wandb-media, tmp*wandb-artifacts), which rank 0
    # removed as it left (os._exit skips wandb's removal at exit: the control, a process that imports wandb and
    # leaves so). torch's inductor cache (torchinductor_<user>) is meant to stay.
    assert not list((tmp_path / "tmp").glob("*wandb*"))
    (tmp_path / "control").mkdir()
    control = subprocess.run([sys.executable, "-c", "import os, wandb.sdk.data_types._private as p; "
                              "print(p.MEDIA_TMP.name, flush=True); os._exit(0)"],
                             env={**os.environ, "TMPDIR": str(tmp_path / "control")}, capture_output=True, text=True,
                             check=True, timeout=120)
    assert Path(control.stdout.strip()).parent == tmp_path / "control" and Path(control.stdout.strip()).is_dir()


# hyperparameters whose names say they are secrets, and one whose name does not (the control)
SECRETS = {"hf_token": "hf_notForTrackersAAA111", "api_key": "apiNotForTrackersBBB222",
           "my_secret": "myNotForTrackersCCC333"}
VISIBLE = "shownToTrackersDDD444"


def files_holding(root: Path, value: str) -> list[str]:
    """Every file under `root` (links followed) whose bytes hold `value`."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and value.encode() in p.read_bytes())


def test_a_local_jobs_tracker_files_hold_no_secret_of_its_hyperparameters(tmp_path, home):
    """Under the bootstrap (SM_TRAINING_ENV, /opt/ml/input/config/hyperparameters.json: what W&B's
    SageMaker integration looks for) every file W&B and MLflow write is searched for each secret."""
    pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
    pytest.importorskip("mlflow", reason="MLflow (smlaunch[mlflow]) is not installed")
    store, wandb_dir = tmp_path / "mlruns", tmp_path / "wandb"
    wandb_dir.mkdir()
    hyperparameters = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 32,
                       "train_batch_size": 2, "max_steps": 2, "wandb_project": "smlaunch-tests",
                       "mlflow_tracking_uri": store.as_uri(), **SECRETS, "note_text": VISIBLE}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
        "instance_count": 1, "processes_per_host": 1, "hyperparameters": hyperparameters,
        "environment": {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "MLFLOW_ALLOW_FILE_STORE": "true"}}))
    done = smlaunch("submit", str(spec), "--job-name", "tracker-secrets", env=cli_env(home), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    for name, value in SECRETS.items():
        assert (name, files_holding(wandb_dir, value), files_holding(store, value)) == (name, [], [])
    # the control: the search finds a value that is no secret, in the W&B run and the MLflow parameter
    assert any(p.endswith(".wandb") for p in files_holding(wandb_dir, VISIBLE))
    assert [p.rsplit("/", 2)[-2:] for p in files_holding(store, VISIBLE)] == [["params", "note_text"]]
    # the run's config is what docs/metrics.md says: the hyperparameters and smlaunch's facts (W&B adds _wandb)
    config = next(r["run"] for r in wandb_records(wandb_dir) if r["type"] == "run")["config"]["update"]
    assert set(config) == {*hyperparameters, "smlaunch", "_wandb"}
    assert {name: config[name] for name in SECRETS} == dict.fromkeys(SECRETS, "****")


def test_on_sagemaker_wandb_continues_the_run_id_smlaunch_recorded(tmp_path, tracker_env, monkeypatch):
    """W&B's SageMaker integration (on where SM_TRAINING_ENV exists) replaced the id passed to
    wandb.init with `<TRAINING_JOB_NAME>-<random>-<host>`: a restart could not continue its run."""
    pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
    from container.trackers import weights_and_biases
    from container.trackers.continuity import RunIds
    from container.trackers.run_info import run_info
    from container.trackers.sink import FINISHED
    from launcher.config import TrainingHyperparameters

    monkeypatch.setenv("SM_TRAINING_ENV", json.dumps({"hosts": ["algo-1"], "hyperparameters": {"hf_token": SECRET}}))
    hp = TrainingHyperparameters(wandb_project="smlaunch-tests", hf_token=SECRET)
    ids = RunIds(tmp_path / "checkpoints")
    first = weights_and_biases.WandbRun(hp, run_info(hp, 1, None), ids)  # control: a new run, its id recorded
    first.close(FINISHED)
    again = weights_and_biases.WandbRun(hp, run_info(hp, 1, None), ids)  # the restart
    again.close(FINISHED)
    assert again.run.id == first.run.id and not first.run.id.startswith(JOB)
    config = next(r["run"] for r in wandb_runs(tmp_path / "wandb")[-1] if r["type"] == "run")["config"]["update"]
    assert "hosts" not in config and config["hf_token"] == "****"


def test_an_unreachable_tracking_server_warns_or_with_metrics_required_fails_before_training(
        tmp_path, tracker_env, monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow (smlaunch[mlflow]) is not installed")
    pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the refusal at once, not after MLflow's backoff
    server = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.delenv("WANDB_MODE")  # online W&B, with no API key anywhere
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    records = run_train(tmp_path / "warned", 2, max_steps=2, mlflow_tracking_uri=server, wandb_project="p")
    assert [r["step"] for r in records] == [1, 2]  # trained, without either
    log = (tmp_path / "warned" / "rank-logs" / "rank0.log").read_text()
    assert log.count("MLflow could not start") == 1 and log.count("Training goes on without it") == 2
    assert "Weights & Biases could not start: UsageError: No API key configured" in log

    with pytest.raises(AssertionError, match="MLflow could not start.*metrics_required: the job stops before"):
        run_train(tmp_path / "required", 2, max_steps=2, mlflow_tracking_uri=server, metrics_required=True)
    assert not (tmp_path / "required" / "out" / "metrics.jsonl").exists()  # not a step was trained


def mlflow_runs(store: Path, experiment: str):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=store.as_uri())
    return client, client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_a_restart_from_the_checkpoints_continues_the_same_runs_without_sending_a_step_twice(tmp_path, tracker_env):
    pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
    pytest.importorskip("mlflow", reason="MLflow (smlaunch[mlflow]) is not installed")
    store = tmp_path / "mlruns"
    trackers = {"wandb_project": "smlaunch-tests", "mlflow_tracking_uri": store.as_uri(),
                "mlflow_experiment_name": "restarts"}
    run = tmp_path / "run"
    # the first start checkpoints at step 3 and logs step 4 before it ends; the restart resumes at
    # step 3, so it trains step 4 again (the same loss: a resume is exact) and goes on to 6
    first = run_train(run, 2, max_steps=4, checkpoint_freq=3, **trackers)
    second = run_train(run, 2, max_steps=6, checkpoint_freq=3, **trackers)
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    assert [r["step"] for r in second] == [1, 2, 3, 4, 4, 5, 6]  # metrics.jsonl is appended to
    assert second[4]["loss"] == pytest.approx(first[3]["loss"], rel=1e-6)
    log = (run / "rank-logs" / "rank0.log").read_text()
    assert "MLflow's run already has steps up to 4 from before the restart" in log

    client, runs = mlflow_runs(store, "restarts")
    (found,) = runs  # one run for the training run, not one per start
    assert found.info.status == "FINISHED"
    history = [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "train/loss")]
    assert history == [(r["step"], r["loss"]) for r in first + second[5:]]  # step 4 once, from the first start

    wandb_runs = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and len({p.name.rsplit("-", 1)[1] for p in wandb_runs}) == 1  # one run id
    recorded = json.loads((run / "checkpoints" / "trackers.json").read_text())
    assert recorded["wandb"]["id"] == wandb_runs[0].name.rsplit("-", 1)[1]
    assert recorded["mlflow"]["id"] == found.info.run_id
    assert store.as_uri() not in json.dumps(recorded)  # a digest of where: a URI may hold a credential

    # control: a run without checkpoints cannot resume, so it has a run of its own
    run_train(tmp_path / "no-checkpoints", 2, max_steps=2, **trackers)
    assert len(mlflow_runs(store, "restarts")[1]) == 2


def test_a_failed_job_leaves_its_runs_failed_not_running(tmp_path, tracker_env):
    pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
    pytest.importorskip("mlflow", reason="MLflow (smlaunch[mlflow]) is not installed")
    store = tmp_path / "mlruns"
    empty = tmp_path / "empty-channel"
    empty.mkdir()
    with pytest.raises(AssertionError, match="train.py failed"):  # the trackers start, then the data fails
        run_train(tmp_path / "run", 2, max_steps=2, dataset_type="jsonl", training_dir=str(empty),
                  wandb_project="smlaunch-tests", mlflow_tracking_uri=store.as_uri(), mlflow_experiment_name="fails")
    (found,) = mlflow_runs(store, "fails")[1]
    assert found.info.status == "FAILED"
    logged = wandb_records(tmp_path / "wandb")
    assert [r["exit"]["exit_code"] for r in logged if r["type"] == "exit"] == [1]


def test_the_plans_prediction_shipped_with_the_job_reaches_its_runs(tmp_path, tracker_env):
    """The archive of the seed's p5 job carries `smlaunch plan`'s prediction (launcher.wire.job_plan);
    train.py run from that archive, as a job runs it, gives it to W&B's config and MLflow's tags."""
    pytest.importorskip("wandb", reason="wandb (smlaunch[wandb]) is not installed")
    pytest.importorskip("mlflow", reason="MLflow (smlaunch[mlflow]) is not installed")
    import os
    import tarfile

    from launcher.backends.sourcedir import build_job_sourcedir
    from launcher.config.jobfile import validate_job_file
    from tests.support.train_runs import ROOT

    job_file = ROOT / "configs" / "seed" / "p5-cp8-bf16.yaml"
    planned = json.loads(subprocess.run([str(Path(sys.executable).with_name("smlaunch")), "plan", str(job_file),
                                         "--json"], capture_output=True, text=True, check=True).stdout)[0]
    bundle = build_job_sourcedir(validate_job_file(job_file), tmp_path / "sourcedir.tar.gz")
    code = tmp_path / "code"
    with tarfile.open(bundle.path) as tar:
        tar.extractall(code, filter="data")
    store = tmp_path / "mlruns"
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(code / "train.py"), "--model_preset", "llama3-tiny", "--dataset_type",
                    "synthetic", "--max_context_width", "64", "--train_batch_size", "2", "--max_steps", "2",
                    "--wandb_project", "smlaunch-tests", "--mlflow_tracking_uri", store.as_uri(),
                    "--output_data_dir", str(out), "--model_dir", str(tmp_path / "model")],
                   cwd=code, check=True, capture_output=True, timeout=240,
                   env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"})

    expected = {"models": planned["models"], "instance_type": "ml.p5.48xlarge", "instance_count": 1,
                "fits": planned["fits"], "peak_memory_gib": planned["peak_gib"],
                "capacity_gib": planned["capacity_gib"], "dominant_memory": planned["dominant"],
                "tokens_per_s": planned["tokens_per_s"], "step_s": planned["step_s"],
                "tokens_per_s_per_gpu": planned["throughput"]["tokens_per_s_per_gpu"],
                "tflops_per_gpu": planned["throughput"]["tflops_per_gpu"], "mfu": planned["throughput"]["mfu"],
                "bound_by": planned["throughput"]["bound_by"], "usd_per_hour": planned["usd_per_hour"],
                "usd_per_billion_tokens": planned["usd_per_billion_tokens"]}
    run = next(r["run"] for r in wandb_records(tmp_path / "wandb") if r["type"] == "run")
    assert run["config"]["update"]["smlaunch"]["plan"] == expected
    (found,) = mlflow_runs(store, "Default")[1]
    assert {k.removeprefix("smlaunch.plan."): v for k, v in found.data.tags.items()
            if k.startswith("smlaunch.plan.")} == {k: str(v) for k, v in expected.items()}
