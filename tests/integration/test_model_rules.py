"""Client-side model resolution: for smlaunch's train.py the model must be known, loadable and
implemented before anything is written or sent; a script of the user's own only gets warnings.
Here the tests that start processes; the rest are tests/unit/test_model_rules.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.model_rules import job

pytest.importorskip("transformers")


def test_plan_of_a_job_without_its_model(tmp_path, own_script):
    """A script of the user's own that does not say its model has nothing to plan: plan says so and exits 0;
    smlaunch's runtime without a model cannot train at all: exit 2 naming the fix."""
    on_p4d = {"instance_type": "ml.p4d.24xlarge", "processes_per_host": 8,
              "framework_version": "2.8.0", "py_version": "py312"}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job({}, script=own_script, **on_p4d)))
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "plan", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and "models: nothing: this script does not say its model" in proc.stdout
    path.write_text(json.dumps(job({}, **on_p4d)))
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "plan", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and "cannot tell which model" in proc.stderr
