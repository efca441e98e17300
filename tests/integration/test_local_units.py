"""Pieces of local mode that need no run: the artifact merge, the status record, the stale
supervisor, and where /opt/ml arguments land when the tree moves.
Here the tests that start processes; the rest are tests/unit/test_local_units.py."""

from __future__ import annotations

import subprocess
import sys

from launcher.backends.local import LocalBackend
from launcher.local import store
from launcher.local.spec import LocalJobSpec
from launcher.local.supervise import Supervisor


def test_a_job_whose_supervisor_died_is_reported_failed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = tmp_path / "jobs"
    store.write(root / "orphan", {"TrainingJobName": "orphan", "TrainingJobStatus": "InProgress",
                                  "SecondaryStatus": "Training", "SupervisorPid": dead.pid})
    record = LocalBackend(root=root).describe("orphan")
    assert record["TrainingJobStatus"] == "Failed"
    assert f"supervisor (pid {dead.pid}) ended without recording an outcome" in record["FailureReason"]


class CannotStart:
    name = "broken"

    def start(self, spec):
        raise RuntimeError("no engine answered")

    def cleanup(self, spec):
        self.cleaned = True


def test_a_runner_that_cannot_start_ends_the_job_failed(tmp_path):
    job_dir = tmp_path / "jobs" / "j"
    store.write(job_dir, {"TrainingJobName": "j", "TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting"})
    spec = LocalJobSpec(name="j", job_dir=job_dir, hosts=["algo-1"], instance_type="local", processes_per_host=1,
                        hyperparameters={}, channels={}, environment={}, checkpoint_dir=job_dir / "checkpoints",
                        max_run=60)
    runner = CannotStart()
    record = Supervisor(spec, runner, printer=None).run()
    assert record["TrainingJobStatus"] == "Failed" and runner.cleaned
    assert record["FailureReason"] == "ClientError: RuntimeError: no engine answered"
    assert "could not start the hosts: no engine answered" in (job_dir / "logs" / "job.log").read_text()


