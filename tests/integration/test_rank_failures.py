"""A failed rank ends the job in seconds, never a hang, with that rank's traceback as the reason.

Each job runs as a user runs it: `smlaunch submit --local`, one host x 2 processes, train.py
behind a small wrapper entry point that makes rank 1 (only) raise at one point of the run. The
job must fail well within the bound (far below any timeout), and `smlaunch status --json`'s
FailureReason (the bootstrap's output/failure) must name rank 1 and carry its exception.
A rank left alone in a collective fails after `collective_timeout`, which every group of the
mesh gets; and ranks die with their torchrun agent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml

from launcher.wire.opt_ml import free_port
from tests.support.gloo import spawn
from tests.support.local_jobs import cli_env, processes_in, smlaunch, wait_for
from tests.support.train_runs import ROOT

BOUND_S = 60  # from submit to the failed job; the collective timeout stays at its 600 s default
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 4,
      "train_batch_size": 2, "checkpoint_freq": 2, "logging_freq": 1}

# The wrapper entry point: it imports container.trainer (so the job is a smlaunch runtime job),
# patches one function in rank 1's process, and runs train.py as torchrun would.
WRAPPER = """
import os
import runpy
from pathlib import Path

import container.trainer

RANK = int(os.environ["RANK"])


def fail(*args, **kwargs):
    raise RuntimeError("injected failure at {point} on rank 1")


{patch}

runpy.run_path(str(Path(__file__).with_name("train.py")), run_name="__main__")
"""

# point -> the patch, made in rank 1 only before train.py starts
INJECTIONS = {
    "runtime init": "import container.distributed.runtime; container.distributed.runtime.init_device_mesh = fail",
    "checkpoint resume": ("import container.checkpoint.checkpointer; "
                          "container.checkpoint.checkpointer.Checkpointer.load_latest = fail"),
    "mid-step": """
import container.loop as t
calls = []
real = t.token_loss_sum
def flaky(*args, **kwargs):
    calls.append(1)
    return fail() if len(calls) == 3 else real(*args, **kwargs)
t.token_loss_sum = flaky
""",
    "checkpoint save": "import container.checkpoint.checkpointer; container.checkpoint.checkpointer.dcp.save = fail",
}


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def wrapper_job(tmp_path: Path, code: str, point: str, **hyperparameters) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(ROOT / "entrypoints" / "train.py", src / "train.py")
    (src / "inject.py").write_text(WRAPPER.format(patch=code, point=point))
    job = {"entry_point": "inject.py", "source_dir": str(src), "instance_type": "local", "instance_count": 1,
           "processes_per_host": 2, "distribution": {"torch_distributed": {"enabled": True}},
           "base_job_name": "inject", "hyperparameters": {**HP, **hyperparameters}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return tmp_path / "job.yaml"


def run_failing(spec: Path, home: Path) -> tuple[str, float, str]:
    """(FailureReason, seconds from submit to the end, console output) of a job that must fail."""
    env = cli_env(home)
    started = time.monotonic()
    proc = smlaunch("submit", str(spec), "--local", env=env, timeout=BOUND_S * 3)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    described = json.loads(smlaunch("status", name, "--json", env=env).stdout)
    assert described["TrainingJobStatus"] == "Failed"
    assert processes_in(home / "jobs" / name) == []
    return described["FailureReason"], elapsed, proc.stdout + proc.stderr


@pytest.mark.parametrize("point", list(INJECTIONS))
def test_a_rank_failing_ends_the_job_fast_with_its_traceback(tmp_path, home, point):
    patch = "if RANK == 1:\n" + textwrap.indent(INJECTIONS[point].strip(), "    ")
    reason, elapsed, output = run_failing(wrapper_job(tmp_path, patch, point), home)
    assert elapsed < BOUND_S, f"the job took {elapsed:.0f} s to fail:\n{output[-3000:]}"
    assert "rank 1 (host algo-1, local rank 1) exited with code 1" in reason, reason
    assert f"RuntimeError: injected failure at {point} on rank 1" in reason, reason
    assert "inject.py" in reason  # the failing rank's own traceback, not its peer's


# Rank 1 stays alive and never enters the collective rank 0 waits in: only collective_timeout,
# from the job's hyperparameters through train.py to the process groups, ends rank 0's wait.
SKIP_COLLECTIVE = """
import time

import torch
import torch.distributed as dist


def train(rt, hp, dirs, instance_type=None):
    if rt.rank == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1), group=rt.loss_group)


container.trainer.train = train
"""


def test_a_skipped_collective_fails_after_collective_timeout(tmp_path, home):
    spec = wrapper_job(tmp_path, SKIP_COLLECTIVE, "collective", collective_timeout=3)
    reason, elapsed, output = run_failing(spec, home)
    assert elapsed < BOUND_S, f"the job took {elapsed:.0f} s to fail:\n{output[-3000:]}"
    assert "rank 0 (host algo-1, local rank 0) exited with code 1" in reason, reason
    assert "Timed out waiting 3000ms" in reason, reason
    assert "collectives time out after 3 s" in output


# A rank that records its pid once its runtime is up, then would wait for ten minutes.
ORPHAN = """
import os
import sys
import time
from pathlib import Path

from container.distributed.runtime import init_runtime
from launcher.config import ModelParallelParameters

init_runtime(ModelParallelParameters())
Path(sys.argv[1], f"rank-{os.environ['RANK']}.pid").write_text(str(os.getpid()))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_die_with_their_torchrun_agent(tmp_path):
    (tmp_path / "orphan.py").write_text(ORPHAN)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), "--log-dir", str(tmp_path / "logs"),  # else a /tmp dir torch keeps
         str(tmp_path / "orphan.py"), str(tmp_path)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank-*.pid"))) == 2)
        pids = [int(p.read_text()) for p in tmp_path.glob("rank-*.pid")]
        agent.kill()  # SIGKILL: torchrun cannot stop its ranks
        agent.wait()
        wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=15)
    finally:
        agent.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _every_group_times_out_as_configured(root: str) -> None:
    from container.distributed.runtime import init_runtime
    from launcher.config import ModelParallelParameters

    # tests.gloo made the default group (torch's 30 min timeout); the mesh adds groups of its own
    os.environ.update(RANK=str(dist.get_rank()), WORLD_SIZE="2", LOCAL_RANK=str(dist.get_rank()))
    rt = init_runtime(ModelParallelParameters(hybrid_shard_degree=1), collective_timeout=7)
    groups = [dist.group.WORLD, *(rt.mesh.get_group(name) for name in rt.mesh.mesh_dim_names),
              *(view.get_group() for view in rt.flat.values())]
    assert len({g.group_name for g in groups}) > 1
    for group in groups:
        assert group._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=7), group.group_name


def test_collective_timeout_reaches_every_group_of_the_mesh(tmp_path):
    spawn(2, _every_group_times_out_as_configured, str(tmp_path))
