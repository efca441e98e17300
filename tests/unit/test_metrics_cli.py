"""`smlaunch metrics`: a job's metrics as a table, JSON and a plot, for local jobs (the demo's
tiny job, run for real) and SageMaker jobs (moto: output.tar.gz in S3, CloudWatch datapoints).

Expected values are read independently of launcher.backends.jobmetrics: straight from the job's
metrics.jsonl file, or from what the test itself put into S3 and CloudWatch.
Here the tests that run in one process; those that start processes are tests/integration/test_metrics_cli.py."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import timedelta

import pytest
from click.testing import CliRunner

from launcher.backends import jobmetrics, metric_records
from launcher.backends.local import LocalBackend
from launcher.cli import metrics_view
from launcher.cli.app import main
from launcher.wire.metric_lines import DamagedMetrics, drop_cut_line, parse_records
from tests.support.local_jobs import job_file
from tests.support.metrics_cli import ONE_PROCESS, RUN_HP
from tests.support.sagemaker_jobs import BUCKET, REGION, make_job, moto_job, set_status

pytest.importorskip("matplotlib")


def test_a_line_being_written_is_skipped_and_a_damaged_one_is_an_error():
    records = parse_records('{"step": 1, "loss": 2.5}\n{"step": 2, "lo', "m.jsonl")
    assert records == [{"step": 1, "loss": 2.5}]  # the trainer is still appending the second line
    for damaged in ('{"step": 1\n{"step": 2, "loss": 2.5}\n', '[1, 2]\n{"step": 2, "loss": 2.5}\n'):
        with pytest.raises(DamagedMetrics) as exc:
            parse_records(damaged, "m.jsonl")
        assert "m.jsonl: line 1 is not a JSON object" in str(exc.value) and "delete that line" in str(exc.value)
    # the last line, once it has its newline, is a line like any other: damaged, not being written
    with pytest.raises(DamagedMetrics, match="line 2 is not a JSON object"):
        parse_records('{"step": 1, "loss": 2.5}\n{"step": 2, "lo\n', "m.jsonl")


def test_a_line_a_crash_cut_is_dropped_before_the_next_attempt_appends(tmp_path):
    """A record cut before its newline (a lost host, a full disk) is removed when the next attempt
    opens the file, so that its first record does not join the cut one in a damaged middle line."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "lo')
    assert drop_cut_line(path) == len('{"step": 2, "lo')
    with path.open("a") as f:
        f.write('{"step": 2, "loss": 2.25}\n')
    assert parse_records(path.read_text(), str(path)) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}]
    # control: a file whose lines are whole, and one that is a single cut line, and none at all
    assert drop_cut_line(path) == 0 and len(path.read_text().splitlines()) == 2
    path.write_text('{"st' + "x" * 5000)
    assert drop_cut_line(path) == 5004 and path.read_text() == ""
    assert drop_cut_line(tmp_path / "none.jsonl") == 0


def test_a_scripts_own_metrics_get_a_column_and_a_panel_each():
    """Records of metric_definitions (x `point`): their names are the columns and the panels; the
    runtime's step records keep the runtime's columns (the control)."""
    from rich.console import Console

    script = metric_records.JobMetrics("local:own", "job.log", [
        {"point": 1, "train:loss": 2.5}, {"point": 1, "acc": 0.25}, {"point": 2, "train:loss": 1.25}], x="point")
    out = Console(width=200, record=True)
    out.print(metrics_view.table(script, None))
    text = out.export_text()
    assert "value no. (per metric, in log order)" in text and "train:loss" in text and "acc" in text
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    assert rows == [["1", "2.5", "0.25"], ["2", "1.25", ""]]
    fig = metrics_view.plot([script])
    assert [ax.get_ylabel() for ax in fig.axes] == ["train:loss", "acc"]
    assert fig.axes[-1].get_xlabel() == "value no. (per metric, in log order)"
    runtime = metric_records.JobMetrics("local:rt", "metrics.jsonl", [
        {"step": 1, "loss": 2.5, "tokens_per_s": 100.0, "epoch": 0}])
    out = Console(width=200, record=True)
    out.print(metrics_view.table(runtime, None))
    header = next(line for line in out.export_text().splitlines() if "step" in line)
    assert "loss" in header and "tokens/s" in header and "epoch" not in header
    assert [ax.get_ylabel() for ax in metrics_view.plot([runtime]).axes] == ["loss", "tokens/s", "grad norm"]


def test_a_restarted_job_is_drawn_once_per_step_with_its_restart_marked():
    """Issue 49: attempt 0 logged steps 1-6 and failed; attempt 1 resumed from the checkpoint of step 4
    (rank 0's restart record) and logged steps 5-8 again and on. The curves had steps 5 and 6 twice (the
    line went back) and nothing showed the restart; a job that never restarted is drawn as before."""
    first = [{"step": s, "loss": 10.0 - s, "tokens_per_s": 100.0 * s, "grad_norm": 1.0, "attempt": 0}
             for s in range(1, 7)]
    event = {"step": 4, "restarts": 1, "restart_reason": "attempt 0 failed (fault, restarted): rank 0 was killed"}
    second = [{"step": s, "loss": 9.5 - s, "tokens_per_s": 50.0 * s, "grad_norm": 2.0, "attempt": 1, "restarts": 1}
              for s in range(5, 9)]
    restarted = metric_records.JobMetrics("local:r", "metrics.jsonl", [*first, event, *second])
    assert restarted.series("loss") == ([1, 2, 3, 4, 5, 6, 7, 8], [9.0, 8.0, 7.0, 6.0, 4.5, 3.5, 2.5, 1.5])
    assert restarted.restarts() == [4]
    fig = metrics_view.plot([restarted])
    for ax in fig.axes:
        [curve] = [line for line in ax.get_lines() if len(line.get_xdata()) > 2]
        assert list(curve.get_xdata()) == [1, 2, 3, 4, 5, 6, 7, 8]  # each step once
        [marker] = [line for line in ax.get_lines() if len(line.get_xdata()) == 2]
        assert list(marker.get_xdata()) == [4, 4] and marker.get_linestyle() == ":"
    assert "local:r restarted" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    once = metric_records.JobMetrics("local:o", "metrics.jsonl", first)  # the control: no restart
    assert once.series("loss") == ([1, 2, 3, 4, 5, 6], [9.0, 8.0, 7.0, 6.0, 5.0, 4.0]) and once.restarts() == []
    assert all(len(line.get_xdata()) == 6 for ax in metrics_view.plot([once]).axes for line in ax.get_lines())


def test_bad_plot_path_and_handles_are_refused_before_any_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    for value, words in ((str(tmp_path / "missing" / "loss.png"), "does not exist"),
                         (str(tmp_path / "loss.jpg"), "is not a .png, .svg, .pdf file"),
                         (str(tmp_path), "is a directory")):
        result = runner.invoke(main, ["metrics", "local:whatever", "--plot", value])
        assert result.exit_code == 2 and "--plot" in result.output and words in result.output, result.output
        assert "no local job" not in result.output  # the path is checked first
    assert not (tmp_path / "missing").exists()
    result = runner.invoke(main, ["metrics", "local:bad/name"])
    assert result.exit_code == 2 and "contains '/'" in result.output
    result = runner.invoke(main, ["metrics", "local:absent-job"])
    assert result.exit_code == 1 and "no local job 'absent-job'" in result.output


def test_a_local_job_without_metrics_yet_says_where_it_looked(tmp_path, home, corpus):  # noqa: F811
    from launcher.local import store

    train, _ = corpus
    spec = job_file(tmp_path / "job.yaml", instance_count=1, processes_per_host=1, distribution=ONE_PROCESS,
                    inputs={"train": str(train)}, hyperparameters=RUN_HP)
    from launcher.config.jobfile import validate_job_file

    backend = LocalBackend()  # prepared, not run: `wait` would run it
    name = backend.submit(validate_job_file(spec, ()), job_name="not-started")
    with pytest.raises(jobmetrics.NoMetricsError) as exc:
        backend.metrics(name)
    expected = store.job_dir(name) / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl"
    assert f"job local:{name} (InProgress) has no metrics yet: {expected} does not exist" in str(exc.value)


# --- SageMaker (moto) --------------------------------------------------------------------------------
@pytest.fixture
def sagemaker(fake_credentials, no_network, monkeypatch, tmp_path):
    import boto3
    from moto import mock_aws

    from launcher.backends.sagemaker import SageMakerBackend

    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        session.client("s3").create_bucket(Bucket=BUCKET)
        backend = SageMakerBackend(session, printer=lambda line: None)
        backend.submit(make_job(), job_name="sm-metrics-1")
        yield session, backend, "sm-metrics-1"


RECORDS = [{"step": 10, "loss": 3.5, "grad_norm": 1.25, "lr": 0.001, "tokens_per_s": 1000.0},
           {"step": 20, "loss": 3.0, "grad_norm": 0.75, "lr": 0.0005, "tokens_per_s": 1200.0},
           {"step": 20, "val_loss": 3.25}]


def test_a_completed_sagemaker_job_reads_metrics_from_its_output_archive(sagemaker):
    session, backend, name = sagemaker
    set_status(name, "Completed")
    data = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("metrics.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    # where SageMaker puts output.tar.gz: <S3OutputPath>/<job>/output/output.tar.gz (make_job: s3://BUCKET/output/)
    session.client("s3").put_object(Bucket=BUCKET, Key=f"output/{name}/output/output.tar.gz", Body=archive.getvalue())

    result = CliRunner().invoke(main, ["metrics", f"sagemaker:{name}", "--json", "--region", REGION])
    assert result.exit_code == 0, result.output
    [job] = json.loads(result.stdout)
    assert job["records"] == RECORDS and job["x"] == "step"
    assert job["source"] == f"s3://{BUCKET}/output/{name}/output/output.tar.gz (metrics.jsonl)"
    fig = metrics_view.plot([backend.metrics(name)])
    assert fig.axes[0].lines[1].get_xydata().tolist() == [[20, 3.25]]


def test_a_running_sagemaker_job_reads_cloudwatch(sagemaker):
    session, backend, name = sagemaker
    job = moto_job(name)  # started ten minutes ago, still running
    started = (job.training_start_time - timedelta(minutes=10)).replace(microsecond=0)  # CloudWatch keeps seconds
    job.training_start_time, job.training_end_time = started, None
    set_status(name, "InProgress")
    start = backend.describe(name)["TrainingStartTime"]
    points = {"train:loss": [3.5, 3.0], "train:tokens_per_sec": [1000.0, 1200.0], "validation:loss": [None, 3.25]}
    cloudwatch = session.client("cloudwatch", region_name=REGION)
    for minute in (0, 1):
        cloudwatch.put_metric_data(Namespace="/aws/sagemaker/TrainingJobs", MetricData=[
            {"MetricName": metric, "Value": values[minute], "Timestamp": start + timedelta(minutes=minute, seconds=5),
             "Dimensions": [{"Name": "TrainingJobName", "Value": name}]}
            for metric, values in points.items() if values[minute] is not None])
    loaded = backend.metrics(name)
    assert loaded.x == "elapsed_s"
    assert loaded.source == "CloudWatch /aws/sagemaker/TrainingJobs (job InProgress: no output.tar.gz yet)"
    # moto's periods start at StartTime: the points fall in the periods starting 0 s and 60 s in
    assert [{k: v for k, v in r.items() if k != "time"} for r in loaded.records] == [
        {"elapsed_s": 0, "loss": 3.5, "tokens_per_s": 1000.0},
        {"elapsed_s": 60, "loss": 3.0, "tokens_per_s": 1200.0, "val_loss": 3.25}]
    fig = metrics_view.plot([loaded])
    assert fig.axes[0].lines[0].get_xydata().tolist() == [[0, 3.5], [60, 3.0]]
    assert fig.axes[2].get_xlabel() == "seconds since the job started"


def test_a_sagemaker_job_without_metrics_yet_is_exit_1(sagemaker):
    _, _, name = sagemaker
    result = CliRunner().invoke(main, ["metrics", f"sagemaker:{name}", "--region", REGION])
    assert result.exit_code == 1
    assert result.output == (f"error: job sagemaker:{name} (Completed) has no metrics yet: s3://{BUCKET}/output/{name}"
                             f"/output/output.tar.gz: does not exist; CloudWatch /aws/sagemaker/TrainingJobs: no "
                             f"datapoints for TrainingJobName={name}\n")
