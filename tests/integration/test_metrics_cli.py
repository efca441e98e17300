"""`smlaunch metrics`: a job's metrics as a table, JSON and a plot, for local jobs (the demo's
tiny job, run for real) and SageMaker jobs (moto: output.tar.gz in S3, CloudWatch datapoints).

Expected values are read independently of launcher.backends.jobmetrics: straight from the job's
metrics.jsonl file, or from what the test itself put into S3 and CloudWatch.
Here the tests that start processes; the rest are tests/unit/test_metrics_cli.py."""

from __future__ import annotations

import json
import shutil

import pytest

from launcher.backends.local import LocalBackend
from launcher.cli import metrics_view
from tests.support.local_jobs import cli_env, job_file, smlaunch
from tests.support.metrics_cli import ONE_PROCESS, RUN_HP, jsonl

pytest.importorskip("matplotlib")


def run_local(tmp_path, home, corpus, base: str, **hyperparameters) -> str:  # noqa: F811 - home: fixture
    train, validation = corpus
    spec = job_file(tmp_path / f"{base}.yaml", base_job_name=base, instance_count=1, processes_per_host=1,
                    distribution=ONE_PROCESS, inputs={"train": str(train), "validation": str(validation)},
                    hyperparameters={**RUN_HP, **hyperparameters})
    proc = smlaunch("submit", str(spec), env=cli_env(home))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))


def test_metrics_of_local_jobs_as_table_json_and_plot(tmp_path, home, corpus, demo_process_job,  # noqa: F811
                                                     monkeypatch):
    """The demo's layout as the session ran it once (tests.support.demo_job: 4 steps, validation every
    2), copied into this test's home beside a one-process job of its own."""
    monkeypatch.setenv("SMLAUNCH_HOME", str(home))
    first = demo_process_job.name
    shutil.copytree(demo_process_job.home / "jobs" / first, home / "jobs" / first)
    second = run_local(tmp_path, home, corpus, "metrics-b", lr=0.01)
    records = jsonl(home, first)
    train = [r for r in records if "loss" in r]
    val = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4] and [r["step"] for r in val] == [2, 4]

    png = tmp_path / "loss.png"
    env = cli_env(home)
    proc = smlaunch("metrics", f"local:{first}", "--plot", str(png), env=env)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    assert imread(png).shape[:2] == (800, 800)  # 8 x 8 inches at 100 dpi
    # the table: one row per step, the validation loss on the row of its step
    row4 = next(line for line in proc.stdout.splitlines() if line.strip("│ ").startswith("4 "))
    assert f"{train[-1]['loss']:.4f}" in row4 and f"{val[-1]['val_loss']:.4f}" in row4

    shortened = smlaunch("metrics", f"local:{first}", "--last", "2", env=env).stdout
    assert "2 earlier row(s) not shown (--all shows them)" in shortened
    assert [line.split("│")[1].strip() for line in shortened.splitlines() if line.startswith("│")] == ["3", "4"]

    listed = json.loads(smlaunch("metrics", first, "--json", env=env).stdout)
    assert listed == [{"job": f"local:{first}", "x": "step", "records": records,
                       # the job's record names its hosts' directories where it ran (the copy's job.json)
                       "source": str(demo_process_job.home / "jobs" / first / "hosts" / "algo-1" / "output" / "data" /
                                     "metrics.jsonl")}]

    # The picture's data is the file's: loss and validation loss, tokens/s, grad norm against step.
    backend = LocalBackend()
    fig = metrics_view.plot([backend.metrics(first)])
    loss_ax, speed_ax, grad_ax = fig.axes
    assert loss_ax.lines[0].get_xydata().tolist() == [[r["step"], r["loss"]] for r in train]
    assert loss_ax.lines[1].get_xydata().tolist() == [[r["step"], r["val_loss"]] for r in val]
    assert speed_ax.lines[0].get_xydata().tolist() == [[r["step"], r["tokens_per_s"]] for r in train]
    assert grad_ax.lines[0].get_xydata().tolist() == [[r["step"], r["grad_norm"]] for r in train]
    assert grad_ax.get_xlabel() == "step" and loss_ax.get_ylabel() == "loss"

    # Two jobs: one line each per panel, named in the legend.
    both = metrics_view.plot([backend.metrics(first), backend.metrics(second)])
    assert [line.get_label() for line in both.axes[2].lines] == [f"local:{first}", f"local:{second}"]
    legend = [t.get_text() for t in both.axes[0].get_legend().get_texts()]
    assert {f"local:{first}", f"local:{second}"} <= set(legend)
    other = [r for r in jsonl(home, second) if "loss" in r]
    assert both.axes[0].lines[2].get_xydata().tolist() == [[r["step"], r["loss"]] for r in other]
    proc = smlaunch("metrics", first, second, "--plot", str(tmp_path / "both.svg"), env=env)
    assert proc.returncode == 0 and (tmp_path / "both.svg").read_text().startswith("<?xml")


