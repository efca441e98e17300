"""bench/gpu/run.py --dry-run end to end on the CPU (tiny shapes): train.py as a job runs it, the
Hugging Face loop, the planner's prediction, the runtime's traced step and the JSON; the unit half
is tests/unit/test_gpu_bench.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_measures_train_py_and_the_hf_loop_and_plans_them(tmp_path):
    out = tmp_path / "bench.json"
    runs = "1b-trainpy-eager,1b-hf-eager,1b-torchtitan-eager"
    done = subprocess.run([sys.executable, "bench/gpu/run.py", "--dry-run", "--runs", runs, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert data["environment"]["dry_run"] is True and list(data["parts"]) == ["1b"]
    ours, hf = data["runs"]["1b-trainpy-eager"], data["runs"]["1b-hf-eager"]
    for record in (ours, hf):
        assert record["status"] == "ok", record
        steps = record["hyperparameters"]["max_steps"]
        # train.py's last step is profiled (bench/gpu/trainpy.py) and left out of its timed steps
        timed = steps - 1 if record is ours else steps
        assert len(record["losses"]) == steps and len(record["step_s"]) == timed
        assert record["timed_steps"] == timed - record["warmup_steps"]
        assert record["tokens_per_s"] > 0 and record["mfu"] is None  # a CPU has no peak to divide by
    steps = ours["hyperparameters"]["max_steps"]
    assert ours["notes"]["profiled_step"] == steps
    assert ours["notes"]["profile"].startswith(f"rank 0, steps {steps}-{steps}, ops by self_cpu_time_total")
    assert "aten::mm" in ours["notes"]["profile"]
    assert "profile" not in hf["notes"]  # the control: the peer is not profiled
    assert hf["vs_baseline"]["baseline"] == "1b-trainpy-eager"
    plan = data["planner"]["1b-trainpy-eager"]
    assert plan["instance_type"] == "ml.p5.4xlarge" and plan["measured_step_s"] == ours["step_s_median"]
    assert plan["memory_ratio"] > 0 and plan["step_ratio"] > 0
    # the runtime's step traced on fake tensors beside them (`plan --trace`'s code), for train.py's eager run
    assert plan["trace"]["traced_peak_gib"] > 0 and plan["trace"]["memory_ratio"] > 0, plan["trace"]
    assert "trace" not in data["planner"].get("1b-hf-eager", {})  # the control: a peer is not traced
    # the control: a stack that cannot run here is a recorded skip with its reason, not a crash
    titan = data["runs"]["1b-torchtitan-eager"]
    assert titan["status"] == "skipped" and "torchtitan" in titan["reason"]
    assert "1b-torchtitan-eager" in done.stdout and "skipped" in done.stdout
