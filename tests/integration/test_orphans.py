"""No orphans: whatever process of a local job is SIGKILLed, every process of the job ends and
the job's record says why.

The job: 2 simulated hosts, torchrun, a user script whose rank starts a helper process in a
session of its own (the hardest kind to find), all of them sleeping. Each test SIGKILLs one level
(the foreground CLI, the detached supervisor, a host's bootstrap, a host's torchrun), then checks
/proc: every process that was in the job's tree, helpers included, is gone within the bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.local.supervise import STOP_GRACE_S
from tests.support.local_jobs import cli_env
from tests.support.train_runs import ROOT

SCRIPT = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
pids = os.environ["PID_DIR"]
with open(os.path.join(pids, f"rank-{os.environ['RANK']}"), "w") as f:
    f.write(f"{os.getpid()} {helper.pid}")
print("rank", os.environ["RANK"], "started", flush=True)
time.sleep(600)
"""
# Every process SIGTERMed is SIGKILLed after the stop grace: a torchrun whose peer host's
# rendezvous store went first can sit in its shutdown until then (a loaded machine's fresh clone
# did, once), so the bound is the grace and room for a slow machine. A passing run takes seconds.
BOUND_S = STOP_GRACE_S + 30


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process, None once it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return None if state in "ZX" else (int(ppid), state)


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))):
            children.setdefault(stat[0], []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _stat(pid) is not None}


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.fixture
def job(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "entry_point": "train.py", "source_dir": str(source), "instance_type": "local", "instance_count": 2,
        "framework_version": "2.8.0", "py_version": "py312", "environment": {"PID_DIR": str(pid_dir)},
        "distribution": {"torch_distributed": {"enabled": True}}}))
    return path, pid_dir, tmp_path / "home"


def _start(job_file: Path, home: Path, detached: bool, log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "launcher.cli", "submit", str(job_file)] + (["--no-wait"] if detached else [])
    with open(log, "wb") as out:
        return subprocess.Popen(args, cwd=ROOT, env=cli_env(home), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_for_ranks(pid_dir: Path, log: Path) -> set[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        files = sorted(pid_dir.glob("rank-*"))
        if len(files) == 2 and all(f.read_text().strip() for f in files):
            return {int(p) for f in files for p in f.read_text().split()}
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start:\n{log.read_text()[-3000:]}")


def _record(home: Path) -> dict:
    (job_dir,) = (home / "jobs").iterdir()
    return json.loads((job_dir / "job.json").read_text())


@pytest.mark.parametrize("level", ["cli", "supervisor", "bootstrap", "torchrun"])
def test_a_sigkilled_process_leaves_no_process_of_the_job_behind(job, tmp_path, level):
    job_file, pid_dir, home = job
    log = tmp_path / "cli.log"
    cli = _start(job_file, home, detached=level != "cli", log=log)
    try:
        if level != "cli":
            assert cli.wait(timeout=120) == 0, log.read_text()
        ranks_and_helpers = _wait_for_ranks(pid_dir, log)
        supervisor = cli.pid if level == "cli" else _record(home)["SupervisorPid"]
        tree = descendants(supervisor) | ranks_and_helpers | {supervisor}
        bootstraps = sorted(p for p in tree if cmdline(p).endswith("-m container train "))
        torchruns = sorted(p for p in tree if "--node_rank 0 " in cmdline(p))
        assert len(bootstraps) == 2 and len(torchruns) == 1, [cmdline(p) for p in tree]
        target = {"cli": supervisor, "supervisor": supervisor, "bootstrap": next(
            p for p in bootstraps if torchruns[0] in descendants(p)), "torchrun": torchruns[0]}[level]
        os.kill(target, signal.SIGKILL)
        deadline = time.monotonic() + BOUND_S
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = alive(tree)
        assert not left, {pid: cmdline(pid) for pid in left}
        while _record(home)["TrainingJobStatus"] == "InProgress" and time.monotonic() < deadline:
            time.sleep(0.5)
        record = _record(home)
    finally:
        for pid in alive(descendants(cli.pid) | {cli.pid}):
            os.kill(pid, signal.SIGKILL)
        cli.wait(timeout=30)
    assert record["TrainingJobStatus"] == "Failed"
    expected = {
        "cli": f"the local supervisor (pid {supervisor}) ended without recording an outcome",
        "supervisor": f"the local supervisor (pid {supervisor}) ended without recording an outcome",
        "bootstrap": "algo-1 was killed by SIGKILL",
        "torchrun": "torchrun was killed by SIGKILL",
    }[level]
    assert expected in record["FailureReason"], record["FailureReason"]
    assert "output.tar.gz" in record["OutputArtifacts"]
