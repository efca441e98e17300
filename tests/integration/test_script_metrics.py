"""A script of the user's own, run locally: its `metric_definitions` applied to the job's log as
SageMaker applies them give `smlaunch metrics` (table, plot and JSON: issue 38, item 3) and `status`
its values; `status` exits 1 for a job that failed and shows one state where SageMaker's two are the
same; a finished job without metrics says so without "yet". The regex semantics alone:
tests/unit/test_log_metrics.py."""

from __future__ import annotations

import json

import yaml

from tests.support.local_jobs import cli_env, smlaunch

SCRIPT = """
import sys
for step in range(1, 6):
    print(f"step {step} loss={6.0 / step:.4f} throughput: {step * 100} samples/s", flush=True)
print("loss=not-a-number")  # matches, but SageMaker reads no value from it
sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
"""
DEFINITIONS = [{"Name": "train:loss", "Regex": r"loss=([0-9.]+)"},
               {"Name": "train:throughput", "Regex": r"^step \d+ .*throughput: (\d+)"}]


def _job(tmp_path, exit_code: int = 0, definitions=DEFINITIONS):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "fit.py").write_text(SCRIPT)
    data = {"entry_point": "fit.py", "source_dir": str(src), "instance_type": "local", "instance_count": 1,
            "hyperparameters": {"code": exit_code}}
    if definitions:
        data["metric_definitions"] = definitions
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "job.yaml"


def _submit(tmp_path, env, **kwargs) -> str:
    result = smlaunch("submit", str(_job(tmp_path, **kwargs)), "--local", "--job-name", "fit-1", env=env)
    assert "fit-1" in result.stdout + result.stderr, result.stderr
    return "local:fit-1"


def test_metric_definitions_of_a_user_script_give_its_metrics_and_status(tmp_path):
    env = cli_env(tmp_path / "home")
    job = _submit(tmp_path, env)
    result = smlaunch("metrics", job, "--json", env=env)
    assert result.returncode == 0, result.stderr
    [job_metrics] = json.loads(result.stdout)
    assert job_metrics["x"] == "point"
    records = job_metrics["records"]
    loss = [r["train:loss"] for r in records if "train:loss" in r]
    assert loss == [6.0, 3.0, 2.0, 1.5, 1.2]  # the non-number matched line adds nothing
    assert [r["point"] for r in records if "train:loss" in r] == [1, 2, 3, 4, 5]
    assert [r["train:throughput"] for r in records if "train:throughput" in r] == [100, 200, 300, 400, 500]
    status = smlaunch("status", job, env=env)
    assert status.returncode == 0
    assert "fit-1: Completed\n" in status.stdout  # not "Completed (Completed)"
    assert ("last metrics (metric_definitions on the log): train:loss 1.2 (the last of 5), "
            "train:throughput 500 (the last of 5)") in status.stdout


def test_a_failed_job_makes_status_exit_1_and_a_job_without_metrics_says_so(tmp_path):
    env = cli_env(tmp_path / "home")
    job = _submit(tmp_path, env, exit_code=3, definitions=None)
    status = smlaunch("status", job, env=env)
    assert status.returncode == 1 and "Failed" in status.stdout
    assert smlaunch("status", job, "--json", env=env).returncode == 1
    metrics = smlaunch("metrics", job, env=env)
    assert metrics.returncode == 1
    assert "has no metrics:" in metrics.stderr and "yet" not in metrics.stderr
    assert "metric_definitions" in metrics.stderr  # how a script of one's own gets them


def test_a_user_scripts_metrics_show_as_table_plot_and_json(tmp_path):
    """The table and the plot once ended in KeyError: 'point' (only JSON was tested)."""
    env = cli_env(tmp_path / "home")
    src = tmp_path / "src"
    src.mkdir()
    (src / "fit.py").write_text("for i in range(4):\n    print(f'epoch {i} loss: {1.23 - i / 10:.2f}', flush=True)\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "entry_point": "fit.py", "source_dir": str(src), "instance_type": "local", "instance_count": 1,
        "metric_definitions": [{"Name": "train:loss", "Regex": "loss: ([0-9.]+)"}]}))
    submitted = smlaunch("submit", str(tmp_path / "job.yaml"), "--local", "--job-name", "own-1", env=env)
    assert submitted.returncode == 0, submitted.stderr
    shown = smlaunch("metrics", "local:own-1", "--last", "3", env=env)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    lines = shown.stdout.splitlines()
    assert any("value no." in line and "train:loss" in line for line in lines), shown.stdout
    # the last 3 of the 4 values, each on the row of its number; the first one hidden
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert cells == [["2", "1.13"], ["3", "1.03"], ["4", "0.93"]]
    assert "1 earlier row(s) not shown" in shown.stdout
    plotted = smlaunch("metrics", "local:own-1", "--plot", str(tmp_path / "m.png"), env=env)
    assert plotted.returncode == 0 and "Traceback" not in plotted.stderr, plotted.stderr
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {tmp_path / 'm.png'}" in plotted.stdout
    as_json = smlaunch("metrics", "local:own-1", "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    [found] = json.loads(as_json.stdout)
    assert found["x"] == "point" and [r["train:loss"] for r in found["records"]] == [1.23, 1.13, 1.03, 0.93]
