"""Live progress and honest end states, without starting a job: the progress record and its
metric line, the progress bar's two renderings, checkpoints found without torch, SageMaker's
progress from CloudWatch, the `list` table at 80 columns and an empty model directory."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import boto3
import pytest
from rich.console import Console

from launcher.backends.live import LiveProgress
from launcher.cli.jobview import jobs_table, status_lines
from launcher.wire.checkpoints import UNVERIFIED, Checkpoint, latest_in_s3, latest_local
from launcher.wire.metric_lines import (
    Progress,
    eta_seconds,
    format_metric_line,
    from_line,
    parse_metric_line,
    read_progress,
    write_progress,
)

# step 40 of 200 after 48 s: 1.2 s a step, 160 steps left -> 192 s = 0:03:12
LINE = format_metric_line(40, loss=2.71, tokens_per_s=12300.0, max_steps=200, elapsed_s=48.0, eta_s=192.0)


def test_eta_is_the_pace_so_far_times_the_steps_left():
    assert eta_seconds(40, 200, start_step=0, elapsed_s=48.0) == 192.0
    # resumed at step 100: 40 steps in 20 s, 60 left -> 30 s (the steps before the resume do not count)
    assert eta_seconds(140, 200, start_step=100, elapsed_s=20.0) == 30.0
    assert eta_seconds(200, 200, start_step=0, elapsed_s=10.0) == 0.0


def test_the_metric_line_carries_the_progress_status_prints():
    for prefix in ("", "algo-1 | ", "[algo-1] "):  # local/Slurm logs, CloudWatch
        current = from_line(prefix + LINE)
        assert current == Progress(step=40, max_steps=200, loss=2.71, tokens_per_s=12300.0, elapsed_s=48.0,
                                   eta_s=192.0)
        assert current.text() == "step 40/200 (20%), loss 2.71, 12,300 tokens/s, ETA 0:03:12"
    assert current.text(eta=False) == "step 40/200 (20%), loss 2.71, 12,300 tokens/s"
    assert from_line(format_metric_line(40, val_loss=2.5)) is None  # a validation step: no progress
    assert from_line("algo-1 | step=40 max_steps=200") is None  # not a metric line
    assert parse_metric_line("[metrics] step=3 loss=2.5 note=text") == {"step": 3, "loss": 2.5}


def test_the_progress_file_is_replaced_whole(tmp_path):
    write_progress(tmp_path, Progress(10, 100, loss=3.0, updated="2026-01-01T00:00:00+00:00"))
    write_progress(tmp_path, Progress(20, 100, loss=2.5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]  # no temporary file left
    assert json.loads((tmp_path / "progress.json").read_text()) == {"step": 20, "max_steps": 100, "loss": 2.5}
    assert read_progress(tmp_path) == Progress(20, 100, loss=2.5)
    (tmp_path / "progress.json").write_text('{"step": 2')  # damaged: no progress rather than an error
    assert read_progress(tmp_path) is None and read_progress(tmp_path / "missing") is None


def test_the_trainers_writer_adds_the_fields_and_writes_on_rank_0_only(tmp_path, monkeypatch):
    from container import progress as writer

    clock = iter([100.0, 130.0, 0.0])  # started at 100 s; step 30 (resumed at 10) logged at 130 s
    monkeypatch.setattr(writer.time, "monotonic", lambda: next(clock))
    main = writer.ProgressWriter(True, tmp_path / "main", max_steps=50, start_step=10)
    record = {"step": 30, "loss": 2.0, "tokens_per_s": 500.0, **main.fields(30)}
    assert record["max_steps"] == 50 and record["elapsed_s"] == 30.0 and record["eta_s"] == 30.0  # 1.5 s x 20
    main.write(record)
    written = json.loads((tmp_path / "main" / "progress.json").read_text())
    assert {k: written[k] for k in ("step", "max_steps", "loss", "eta_s")} == {
        "step": 30, "max_steps": 50, "loss": 2.0, "eta_s": 30.0}
    assert written["updated"].endswith("+00:00")
    writer.ProgressWriter(False, tmp_path / "other", 50, 0).write(record)
    assert not (tmp_path / "other").exists()


# --- the progress bar ------------------------------------------------------------------------

def test_off_a_terminal_the_lines_print_as_before_and_nothing_else():
    plain, hosts = [], []
    console = Console(file=io.StringIO(), force_terminal=False)
    with LiveProgress(console=console, plain=plain.append,
                      plain_host=lambda *args: hosts.append(args)) as view:
        view.line("algo-1 | " + LINE)
        view.host_line("algo-2", "magenta", "hello")
    assert plain == ["algo-1 | " + LINE] and hosts == [("algo-2", "magenta", "hello")]
    assert console.file.getvalue() == ""  # no bar, no escape codes
    assert view.last.step == 40


def test_on_a_terminal_a_bar_follows_the_metric_lines():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with LiveProgress(console=console, plain=lambda _: pytest.fail("plain printing on a terminal")) as view:
        view.line("algo-1 | starting")
        view.host_line("algo-1", "cyan", LINE)
    text = out.getvalue()
    assert "algo-1 | starting\n" in text
    assert "algo-1 | step  40/200  loss  2.7100     12,300 tokens/s  ETA 0:03:12\n" in text  # the record, short
    final = text.rsplit("\r", 1)[-1]  # the bar's last drawing, left on screen when the job ends
    assert "training" in final and "step 40/200 (20%), loss 2.71, 12,300 tokens/s, ETA 0:03:12" in final
    assert "━" in final


def _launch_line(tmp_path: Path) -> str:
    """The bootstrap's launch line of a two-host torch_distributed job (container.toolkit.bootstrap)."""
    import shlex

    from container.toolkit.bootstrap import launch_command
    from container.toolkit.contract import read_training_env
    from tests.support.bootstrap import host_tree

    base = host_tree(tmp_path, "algo-1", ["algo-1", "algo-2"], {
        "sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True,
        "sagemaker_smlaunch_processes_per_host": 2, **{f"option_{i}": "x" * 20 for i in range(12)}})
    (base / "code" / "train.py").write_text("")
    env = read_training_env(base, num_gpus=0)
    return f"[smlaunch] algo-1: {shlex.join(launch_command(env, tmp_path / 'logs'))} (in {env.code_dir})"


def test_on_a_terminal_records_and_the_launch_print_short_and_off_it_whole(tmp_path):
    """Issue 49: `make demo` printed 400-character [metrics] lines and 650-character torchrun lines."""
    record = {"loss": 3.83808, "grad_norm": 1.3683, "lr": 0.00299181, "samples_per_s": 76.93, "tokens_per_s": 19694.3,
              "tokens_per_s_per_gpu": 4923.57, "tflops_per_gpu": 0.0042, "peak_memory_gib": 0.361, "max_steps": 120,
              "elapsed_s": 4.0, "eta_s": 44.0, "attempt": 0, "start_step": 0,
              "loop_start": "2026-11-28T22:14:15.123+00:00", "time_steps_s": 3.9, "time_data_s": 0.01}
    lines = [format_metric_line(10, **record), format_metric_line(100, **{**record, "loss": 12.5, "eta_s": 3700.0}),
             format_metric_line(40, val_loss=3.21151),
             "[metrics] step=4 restarts=1 restart_reason=attempt 0 failed (fault, restarted)", _launch_line(tmp_path),
             "2026-11-28 22:14:12,939 INFO model llama3-tiny: 125,248 parameters"]
    out = io.StringIO()
    with LiveProgress(console=Console(file=out, force_terminal=True, width=200, color_system=None)) as view:
        for line in lines:
            view.host_line("algo-1", "cyan", line)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).replace("\r", "\n")  # the bar's redrawing
    shown = [line for line in text.splitlines() if line.startswith("algo-1 | ")]
    assert shown == [
        "algo-1 | step  10/120  loss  3.8381  lr 2.99e-03     19,694 tokens/s  ETA 0:00:44",
        "algo-1 | step 100/120  loss 12.5000  lr 2.99e-03     19,694 tokens/s  ETA 1:01:40",
        "algo-1 | step  40/120  val loss  3.2115",
        "algo-1 | " + lines[3],  # a restart's record, as it is
        "algo-1 | [smlaunch] algo-1: torchrun --nnodes 2 --nproc_per_node 2 --node_rank 0 train.py + 24 arguments "
        "(the whole command is in the job's log)",
        "algo-1 | " + lines[5]]  # control: any other line as it is
    hosts = []  # off a terminal (a pipe, a file, a test): every line whole
    with LiveProgress(console=Console(file=io.StringIO(), force_terminal=False),
                      plain_host=lambda *args: hosts.append(args[2])) as view:
        for line in lines:
            view.host_line("algo-1", "cyan", line)
    assert hosts == lines


def test_sagemakers_status_line_goes_into_the_bar():
    from launcher.backends.sagemaker import _status_line

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    with LiveProgress(console=console) as view, _status_line("job-1") as status:
        assert status is view
        status.update("job-1: InProgress (Training)")
    assert "job-1: InProgress (Training)" in out.getvalue().rsplit("\r", 1)[-1]


# --- status and list -------------------------------------------------------------------------

def test_status_lines_of_a_running_and_a_stopped_job():
    running = {"TrainingJobName": "j", "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
               "Progress": Progress(40, 200, 2.71, 12300.0, 48.0, 192.0).to_dict()}
    assert status_lines("local", "j", running) == [
        "j: InProgress (Training)", "backend: local",
        "progress: step 40/200 (20%), loss 2.71, 12,300 tokens/s, ETA 0:03:12"]
    stopped = {**running, "TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped",
               "LastCheckpoint": Checkpoint(43, "/c/step-43", "s3://b/c/step-43").to_dict()}
    assert status_lines("local", "j", stopped)[2:] == [
        "last step: step 40/200 (20%), loss 2.71, 12,300 tokens/s",
        "last checkpoint: step 43, /c/step-43 (copied to s3://b/c/step-43); complete marker, not verified "
        "(resume verifies it and falls back to an older one)"]
    assert stopped["LastCheckpoint"]["Verified"] is False  # status --json says so too
    no_checkpoint = {k: v for k, v in stopped.items() if k not in ("LastCheckpoint", "Progress")}
    assert status_lines("local", "j", no_checkpoint)[2:] == ["last checkpoint: none"]


def test_status_says_restarts_only_of_jobs_that_asked_or_restarted_and_a_scripts_metrics_in_words():
    """Issue 49: `restarts: 0 of 0` on a job that never asked for restarts, and `(value 3)` after a
    script's metric."""
    failure = {"attempt": 0, "at": "2026-11-28T22:12:11+00:00", "failure_class": "fault", "restarted": False,
               "reason": "train.py exited with code 1", "step": None, "extra": {}}
    failed = {"TrainingJobName": "j", "TrainingJobStatus": "Failed", "FailureReason": "train.py exited with code 1",
              "Restarts": [failure], "LastMetrics": {"val_acc": (3, 0.7), "loss": (1, 2.5)}}
    lines = status_lines("local", "j", failed)
    assert not any(line.startswith("restarts:") or "attempt 0" in line for line in lines)
    assert "last metrics (metric_definitions on the log): val_acc 0.7 (the last of 3), loss 2.5 (its only value)" \
        in lines
    # controls: a job with max_restarts says its budget, used or not; restarts are counted where no budget is known
    assert "restarts: 0 of 2 (max_restarts)" in status_lines("local", "j", {**failed, "MaxRestarts": 2})
    restarted = {**failure, "restarted": True}
    lines = status_lines("kubernetes", "j", {**failed, "Restarts": [restarted, {**failure, "attempt": 1}]})
    assert "restarts: 1" in lines and sum("  attempt " in line for line in lines) == 2


def render(table, width: int = 80) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(table)
    return console.file.getvalue().splitlines()


@pytest.mark.parametrize("name", ["smlaunch-train-2026-11-22-18-55-38-176", "a" * 63])
def test_list_fits_80_columns_with_every_handle_whole(name):
    jobs = [{"Handle": f"sagemaker:{name}", "TrainingJobStatus": "InProgress",
             "CreationTime": "2026-11-22T18:55:38.242+00:00", "DurationSeconds": 3723},
            {"Handle": "local:tiny-2026-11-22-18-55-38-176", "TrainingJobStatus": "Stopped",
             "CreationTime": "2026-11-22T18:50:00+00:00", "DurationSeconds": 12}]
    lines = render(jobs_table(jobs, 80))
    assert max(len(line) for line in lines) <= 80
    assert any(f"sagemaker:{name}" in line for line in lines)  # on one line, not cut
    assert any("local:tiny-2026-11-22-18-55-38-176" in line for line in lines)
    if len(name) < 50:  # room for the status and the duration: 1 h 2 min 3 s
        assert "1:02:03" in lines[1] and "InProgress" in lines[1]
    short = render(jobs_table(jobs[1:], 80))
    assert "created" in short[0] and "duration" in short[0] and "0:00:12" in short[1]


# --- checkpoints -----------------------------------------------------------------------------

def checkpoint_dirs(root: Path, complete: list[int], unfinished: list[int]) -> None:
    for step in complete + unfinished:
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / "__0_0.distcp").write_bytes(b"x")
    for step in complete:
        (root / f"step-{step}" / ".complete").write_text(json.dumps({"format": 2, "step": step, "parts": 1}))


def test_the_newest_complete_checkpoint_is_named(tmp_path):
    checkpoint_dirs(tmp_path, complete=[5, 10], unfinished=[20])  # step-20: stopped mid-save, no marker
    (tmp_path / "step-30.tmp").mkdir()
    found = latest_local(tmp_path, "s3://bucket/ckpt/")
    assert (found.step, found.where, found.copy) == (10, str(tmp_path / "step-10"), "s3://bucket/ckpt/step-10")
    assert latest_local(tmp_path / "none") is None


def test_the_newest_complete_checkpoint_in_s3(aws_s3):
    aws_s3.create_bucket(Bucket="ckpt")
    for key in ("run/step-100/.complete", "run/step-100/__0_0.distcp", "run/step-200/__0_0.distcp",
                "run/step-90/.complete", "other/step-300/.complete"):
        aws_s3.put_object(Bucket="ckpt", Key=key, Body=b"{}")
    found = latest_in_s3(aws_s3, "s3://ckpt/run")
    assert (found.step, found.where) == (100, "s3://ckpt/run/step-100")  # step-200 has no marker
    assert latest_in_s3(aws_s3, "s3://ckpt/empty/") is None


@pytest.fixture
def aws_s3(fake_credentials):
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("s3", region_name="us-east-1")


# --- SageMaker: progress from CloudWatch -----------------------------------------------------

def test_sagemaker_status_shows_the_last_metric_line_of_the_logs(fake_credentials):
    from moto import mock_aws

    from launcher.backends.sagemaker import SageMakerBackend
    from launcher.cli import jobview
    from tests.support.sagemaker_jobs import BUCKET, make_job, put_logs, set_status

    with mock_aws():
        session = boto3.Session(region_name="us-east-1")
        session.client("s3").create_bucket(Bucket=BUCKET)
        backend = SageMakerBackend(session, printer=lambda _: None)
        name = backend.submit(make_job(checkpoint_s3_uri=f"s3://{BUCKET}/ckpt"), job_name="live-1")
        set_status(name, "InProgress")
        metric = [format_metric_line(s, loss=3.0 - s / 100, tokens_per_s=9000.0, max_steps=500,
                                     elapsed_s=s * 0.6, eta_s=(500 - s) * 0.6) for s in (10, 20, 30)]
        t = int(time.time() * 1000) - 60_000  # CloudWatch refuses events older than 14 days
        noise = [(t + 2000 + i, f"rank 0 line {i}") for i in range(300)]
        put_logs(session, name, 1, [(t + 1000, metric[0]), (t + 1500, metric[1]), (t + 1800, metric[2]),
                                    (t + 1900, format_metric_line(30, val_loss=2.9)), *noise])
        put_logs(session, name, 2, [(t + 2500, "algo-2 has no metric lines")])
        session.client("s3").put_object(Bucket=BUCKET, Key="ckpt/step-20/.complete", Body=b"{}")
        desc = jobview.describe(backend, name)
        lines = jobview.status_lines("sagemaker", name, desc)
    # step 30 of 500: 470 steps left at 0.6 s = 282 s = 0:04:42
    assert "progress: step 30/500 (6%), loss 2.7, 9,000 tokens/s, ETA 0:04:42" in lines
    assert f"last checkpoint: step 20, s3://{BUCKET}/ckpt/step-20{UNVERIFIED}" in lines
    assert desc["Progress"]["step"] == 30 and desc["LastCheckpoint"]["Step"] == 20


# --- artifacts -------------------------------------------------------------------------------

@pytest.mark.parametrize("model_file", [None, "model.safetensors"])
def test_an_empty_model_directory_gives_no_model_archive(tmp_path, model_file):
    from launcher.backends.local import LocalBackend
    from launcher.local import store
    from launcher.local.spec import LocalJobSpec
    from launcher.local.supervise import Supervisor

    root = tmp_path / "jobs"
    job_dir = root / "j"
    host = job_dir / "hosts" / "algo-1"
    (host / "model").mkdir(parents=True)
    (host / "output" / "data").mkdir(parents=True)
    (host / "output" / "data" / "metrics.jsonl").write_text('{"step": 1}\n')
    if model_file:
        (host / "model" / model_file).write_bytes(b"weights")
    store.write(job_dir, {"TrainingJobName": "j", "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
                          "Backend": "local", "LocalJobDir": str(job_dir)})
    spec = LocalJobSpec(name="j", job_dir=job_dir, hosts=["algo-1"], instance_type="local", processes_per_host=1,
                        hyperparameters={}, channels={}, environment={}, checkpoint_dir=job_dir / "checkpoints",
                        max_run=60)
    supervisor = Supervisor(spec, runner=None, printer=None)
    supervisor._merged = io.StringIO()
    record = supervisor._finish("stopped", [("algo-1", 143)], 1.0)
    assert record["TrainingJobStatus"] == "Stopped" and "FailureReason" not in record
    artifacts = LocalBackend(root=root).artifacts("j")
    assert (job_dir / "output" / "output.tar.gz").is_file() and "output.tar.gz" in artifacts
    if model_file is None:
        assert "ModelArtifacts" not in record and "model.tar.gz" not in record["OutputArtifacts"]
        assert "model.tar.gz" not in artifacts and not (job_dir / "output" / "model.tar.gz").exists()
    else:
        assert artifacts["model.tar.gz"] == record["ModelArtifacts"]["S3ModelArtifacts"]
