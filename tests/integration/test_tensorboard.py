"""TensorBoard: tensorboard_output_config and the tensorboard_dir hyperparameter make rank 0 write
SummaryWriter scalars; local mode hands the container the config as SageMaker does
(input/config/tensorboardoutputconfig.json) and uploads the directory to the config's S3OutputPath.
The scalars are read back with TensorBoard's own EventAccumulator and compared with metrics.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from container.args import directories
from container.tensorboard import TensorBoardScalars
from tests.conftest import LOCAL_S3_BUCKET as BUCKET
from tests.support.local_jobs import HP, cli_env, job_file, smlaunch
from tests.support.train_runs import run_train

pytest.importorskip("tensorboard")


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def same(written: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """The same steps, and values equal to float32 precision (TensorBoard stores float32)."""
    return [s for s, _ in written] == [s for s, _ in expected] and (
        [v for _, v in written] == pytest.approx([v for _, v in expected], rel=1e-6))


def test_local_job_with_tensorboard_output_config_writes_and_uploads_scalars(tmp_path, s3, corpus):  # noqa: F811
    client, endpoint = s3
    train, validation = corpus
    spec = job_file(tmp_path / "job.yaml", base_job_name="tb", instance_count=1, processes_per_host=2,
                    distribution={"torch_distributed": {"enabled": True}},
                    tensorboard_output_config={"s3_output_path": f"s3://{BUCKET}/tb"},
                    inputs={"train": str(train), "validation": str(validation)},
                    hyperparameters={**HP, "train_batch_size": 2, "validation_freq": 2, "validation_batches": 1})
    home = tmp_path / "home"
    env = {**cli_env(home), "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    proc = smlaunch("submit", str(spec), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tensorboard_output_config" not in proc.stderr  # no "has no effect" warning: local mode honours it
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    host = home / "jobs" / name / "hosts" / "algo-1"
    # the container found the config where SageMaker puts it, with the API's default LocalPath
    assert json.loads((host / "input" / "config" / "tensorboardoutputconfig.json").read_text()) == {
        "S3OutputPath": f"s3://{BUCKET}/tb"}
    events = sorted((host / "output" / "tensorboard").iterdir())
    assert len(events) == 1 and events[0].name.startswith("events.out.tfevents.")  # rank 0 only

    records = [json.loads(x) for x in (host / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    written = scalars(host / "output" / "tensorboard")
    train_records = [r for r in records if "loss" in r]
    assert [s for s, _ in written["train/loss"]] == [r["step"] for r in train_records] == [1, 2, 3, 4]
    assert [v for _, v in written["train/loss"]] == pytest.approx([r["loss"] for r in train_records], rel=1e-6)
    assert [v for _, v in written["train/grad_norm"]] == pytest.approx([r["grad_norm"] for r in train_records],
                                                                        rel=1e-6)
    assert same(written["validation/loss"], [(r["step"], r["val_loss"]) for r in records if "val_loss" in r])

    # uploaded where the SageMaker SDK's latest_job_tensorboard_artifacts_path looks
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="tb/")["Contents"]]
    assert keys == [f"tb/{name}/tensorboard-output/{events[0].name}"]
    assert f"TensorBoard: 1 file(s) from {host / 'output' / 'tensorboard'}" in proc.stdout


def test_tensorboard_dir_hyperparameter_without_output_config(tmp_path):
    board = tmp_path / "board"
    records = run_train(tmp_path / "run", 1, max_steps=3, tensorboard_dir=str(board))
    written = scalars(board)
    assert same(written["train/loss"], [(r["step"], r["loss"]) for r in records])
    assert same(written["train/tokens_per_s"], [(r["step"], r["tokens_per_s"]) for r in records])


def test_where_the_container_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    for name in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SMLAUNCH_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert directories({}).tensorboard is None  # no config, no hyperparameter: no TensorBoard
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "tensorboardoutputconfig.json").write_text(json.dumps({"S3OutputPath": "s3://b/tb"}))
    assert directories({}).tensorboard == tmp_path / "output" / "tensorboard"  # /opt/ml, moved with the tree
    (config / "tensorboardoutputconfig.json").write_text(json.dumps(
        {"S3OutputPath": "s3://b/tb", "LocalPath": "/opt/ml/output/data/tb"}))
    assert directories({}).tensorboard == tmp_path / "output" / "data" / "tb"
    assert directories({"tensorboard_dir": "/opt/ml/other"}).tensorboard == tmp_path / "other"
    assert directories({"tensorboard_dir": str(tmp_path / "mine")}).tensorboard == tmp_path / "mine"


def test_asking_for_tensorboard_without_the_package_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(RuntimeError) as exc:
        TensorBoardScalars(tmp_path / "tb")
    assert f"TensorBoard output to {tmp_path / 'tb'} was asked for" in str(exc.value)
    assert "pip install tensorboard" in str(exc.value)
    assert not (tmp_path / "tb").exists()
