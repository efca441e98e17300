"""The demo's layout (2 hosts x 2 processes, hybrid sharding 2 x cp 2) submitted once per test run
with the process runner, for the tests that only read it: test_local_mode's checks of a finished
job and the container test's reference losses (the same job file with the docker runner must give
the same numbers). Each of them submitted it on its own before: a 2 x 2 job is ~25 s of CPU and its
six interpreters' imports.

Shared by the xdist workers through the run's common temporary directory: the first worker to ask
submits it under a file lock, the other reads what it left (the submit's output kept beside it).
A test must not change the job's files: copy what it would modify."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support.local_jobs import HP, cli_env, job_file, smlaunch

NAME = "demo-process"
# a validation pass and a checkpoint every 2 steps, under the seed's --checkpoint_dir
HYPERPARAMETERS = {**HP, "validation_freq": 2, "validation_batches": 2, "checkpoint_freq": 2,
                   "checkpoint_dir": "/opt/ml/checkpoints"}


@dataclass(frozen=True)
class FinishedJob:
    home: Path  # its SMLAUNCH_HOME
    name: str
    output: Path  # output_path/NAME/output: model.tar.gz and output.tar.gz
    stdout: str  # what `smlaunch submit` printed
    returncode: int
    train: Path  # its channels' directories
    validation: Path

    def env(self, **extra: str) -> dict[str, str]:
        return cli_env(self.home, **extra)


def write_corpus(root: Path) -> tuple[Path, Path]:
    """(train dir, validation dir): byte-level JSON Lines blocks of 64 tokens of this project's
    own source, as the training script reads them from its channels."""
    from container.data.packing import byte_tokenize, pack, write_jsonl  # imports torch: only when used

    text = (Path(__file__).resolve().parents[2] / "launcher" / "config" / "rules.py").read_text()
    blocks = list(pack([text], byte_tokenize, 64))
    write_jsonl(blocks[:96], root / "train" / "train.jsonl")
    write_jsonl(blocks[96:112], root / "validation" / "validation.jsonl")
    return root / "train", root / "validation"


def _submit(root: Path) -> dict:
    train, validation = write_corpus(root / "corpus")
    spec = job_file(root / "job.yaml", output_path=str(root / "artifacts"),
                    inputs={"train": str(train), "validation": f"file://{validation}"},
                    hyperparameters=HYPERPARAMETERS)
    proc = smlaunch("submit", str(spec), "--job-name", NAME, env=cli_env(root / "home"), timeout=400)
    return {"stdout": proc.stdout, "stderr": proc.stderr, "returncode": proc.returncode,
            "train": str(train), "validation": str(validation)}


@pytest.fixture(scope="session")
def demo_process_job(tmp_path_factory) -> FinishedJob:
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-demo-process-job"
    root.mkdir(exist_ok=True)
    done = root / "submitted.json"
    with FileLock(str(root / ".lock")):
        if not done.is_file():
            done.write_text(json.dumps(_submit(root)))
    record = json.loads(done.read_text())
    job = FinishedJob(home=root / "home", name=NAME, output=root / "artifacts" / NAME / "output",
                      stdout=record["stdout"], returncode=record["returncode"], train=Path(record["train"]),
                      validation=Path(record["validation"]))
    assert job.returncode == 0, record["stdout"][-4000:] + record["stderr"][-4000:]
    return job
