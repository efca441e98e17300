"""Two kinds of job: smlaunch's runtime gets its own rules; a user's script gets the launcher's
rules only, and its hyperparameters pass through as written.
Here the tests that start processes; the rest are tests/unit/test_job_kind.py."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.job_kind import DLC, job
from tests.support.train_runs import ROOT


def test_validate_shows_the_kind(tmp_path, own):
    path = tmp_path / "job.json"
    for source, kind in ((own, "user script (train.py does not import container.trainer)"),
                         (ROOT / "entrypoints", "smlaunch runtime (train.py imports container.trainer)")):
        path.write_text(json.dumps(job(source)))
        proc = subprocess.run([sys.executable, "-m", "launcher.cli", "validate", str(path), "--json"],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["summary"]["kind"] == kind


def test_validate_shows_the_image(tmp_path):
    """The image the request would name (build_request takes it from the same job_image)."""
    seed = subprocess.run([sys.executable, "-m", "launcher.cli", "validate", str(ROOT / "configs/seed/p5-cp8-fp8.yaml"),
                           "--json"], capture_output=True, text=True, check=False)
    summary = json.loads(seed.stdout)["summary"]
    assert summary["image"] == f"{DLC.format(region='us-east-1')} (region us-east-1)"
    assert summary["image_reason"] == "image_uri as given (PyTorch 2.8.0)"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job(ROOT / "entrypoints", region="eu-west-1")))
    runtime = subprocess.run([sys.executable, "-m", "launcher.cli", "validate", str(path), "--json"],
                             capture_output=True, text=True, check=False)
    summary = json.loads(runtime.stdout)["summary"]
    assert summary["image"] == f"{DLC.format(region='eu-west-1')} (region eu-west-1)"
    assert summary["image_reason"] == "PyTorch DLC 2.8.0: the default for smlaunch's runtime (needs torch >= 2.6)"
    path.write_text(json.dumps(job(ROOT / "entrypoints", instance_type="local", distribution=None)))
    local = subprocess.run([sys.executable, "-m", "launcher.cli", "validate", str(path), "--json"],
                           capture_output=True, text=True, check=False)
    assert json.loads(local.stdout)["summary"]["image"] == "none: the local process runner uses this machine's Python"


