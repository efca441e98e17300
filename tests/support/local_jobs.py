"""Local jobs as a user runs them: the `smlaunch` CLI in a subprocess with its own SMLAUNCH_HOME,
the demo-shaped job files, and waiting on a job's processes and files."""

from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

import yaml

from tests.support import forked_cli
from tests.support.train_runs import ROOT

# train_batch_size is per data-parallel rank (SMP's meaning): 2 replicas x 2 = the reference's 4.
HP = {"model_preset": "llama3-tiny", "dataset_type": "jsonl", "max_context_width": 64, "max_steps": 4,
      "train_batch_size": 2, "lr": 0.03, "warmup": 0.0, "min_lr": 0.003, "seed": 7, "logging_freq": 1}


HSD_CP = {"torch_distributed": {"enabled": True},
          "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
              "hybrid_shard_degree": 2, "context_parallel_degree": 2}}}}


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "SMLAUNCH_"))}
    env.update(SMLAUNCH_HOME=str(home), OMP_NUM_THREADS="1", NO_COLOR="1", **extra)
    return env


def smlaunch(*args: str, env: dict[str, str], timeout: float = 300, cwd: Path | None = None):
    """`python -m launcher.cli ARGS` run to its end: its exit code and output, as subprocess.run captures
    them; forked from the fork server, which has imported the CLI, unless `env` sets a Python variable of
    its own (tests/support/forked_cli.py)."""
    if forked_cli.forkable(env):
        return forked_cli.run(list(args), env, cwd or ROOT, timeout)
    return subprocess.run([*forked_cli.COMMAND, *args], env=env, cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def job_file(path: Path, **fields) -> Path:
    data = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
            "instance_count": 2, "processes_per_host": 2, "distribution": HSD_CP, "hyperparameters": HP}
    data.update(fields)
    path.write_text(yaml.safe_dump(data))
    return path


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} on {os.environ['CURRENT_HOST']} ready", flush=True)
if os.environ.get("FAIL_RANK") == str(rank):
    raise ValueError(f"boom on rank {rank}")
time.sleep(float(os.environ.get("SLEEP", "600")))
"""


def script_job(tmp_path: Path, **fields) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "job.py").write_text(SCRIPT)
    data = {"entry_point": "job.py", "source_dir": str(src), "instance_type": "local", "instance_count": 2,
            "distribution": {"torch_distributed": {"enabled": True}}, **fields}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "job.yaml"


def processes_in(directory: Path) -> list[int]:
    """Processes whose working directory lies in `directory` (bootstraps, torchrun, ranks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")).is_relative_to(directory):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_for(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")
