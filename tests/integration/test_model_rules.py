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


def test_plan_exits_2_when_nothing_can_be_planned(tmp_path, own_script):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job({}, script=own_script)))
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "plan", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and "cannot plan" in proc.stdout
    path.write_text(json.dumps(job({})))
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "plan", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and "cannot tell which model" in proc.stderr
