"""What the Kubernetes pod tests check once the pods have run (as processes: tests/integration/
test_kubernetes_pods.py; in podman: tests/e2e/test_kubernetes_podman.py): the job trained like one
process on the global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.local_jobs import HP
from tests.support.train_runs import run_train, series


def assert_losses_like_one_process(records: list[dict], train: Path, reference_dir: Path) -> None:
    """2 pods x 1 process (data parallel 2), from rank 0's metric records, against one process with
    their global batch."""
    losses = series(records, "loss")
    assert len(losses) == 4 and losses[-1] < losses[0]
    reference = run_train(reference_dir, 1, **{**HP, "train_batch_size": 4}, training_dir=str(train))
    assert losses == pytest.approx(series(reference, "loss"), rel=1e-5)


def assert_pods_trained_like_one_process(claim: Path, train: Path, reference_dir: Path) -> Path:
    """The pods on a claim trained like one process; the job's directory on the claim."""
    job_dir = claim / "smlaunch-jobs" / "k-1"
    records = [json.loads(line) for line in
               (job_dir / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    assert_losses_like_one_process(records, train, reference_dir)
    return job_dir
