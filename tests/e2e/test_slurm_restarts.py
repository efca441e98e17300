"""Automatic restarts (max_restarts) under a real Slurm (tests/support/slurm_cluster.py: slurmctld
and two slurmd on 127.0.0.1), with the test-only fault injection (launcher.wire.faults):

- a rank killed, then (in the next attempt) a rank hung: each node's bootstrap restarts torchrun
  inside its srun step, the job ends COMPLETED by itself, `status` names both restarts, and the
  last loss of every step equals an uninterrupted run's; with max_restarts 0 the same kill fails
  the job at once;
- a node's processes killed (its srun step's task dies by SIGKILL): the supervisor starts every
  node's step again, on a spare node of the allocation where the job has one (slurm.spare_nodes);
- a node that fails (Slurm takes it DOWN, out of the job's allocation; its processes die with it),
  on a cluster of three nodes: the host moves to the spare node and the job completes;
- the same with no spare node and min_instance_count 1: the job goes on with the node left, with the
  uninterrupted run's losses.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.local import store
from launcher.wire.faults import FAULT_ENV, Fault, fault_spec
from tests.support.local_jobs import cli_env, members, processes_in, wait_for
from tests.support.slurm_cluster import running_cluster
from tests.support.train_runs import ROOT, run_train, series

# 2 nodes x 1 rank (data parallel 2), a checkpoint every 2 steps, a hang found within 5 s.
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 8,
      "train_batch_size": 2, "lr": 0.03, "warmup": 0.0, "min_lr": 0.003, "seed": 7, "logging_freq": 1,
      "checkpoint_freq": 2, "checkpoint_dir": "/opt/ml/checkpoints", "step_timeout": 5}
KILLED = Fault("signal", rank=1, step=3, attempt=0)  # rank 1 (node 2) SIGKILLed before step 3
HUNG = Fault("hang", rank=0, step=6, attempt=1)  # then rank 0 (node 1) stuck before step 6


def smlaunch(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    """A cluster of its own with a third node, for a job of two nodes and a spare."""
    yield from running_cluster(tmp_path_factory.mktemp("slurm3"), nodes=("n1", "n2", "n3"))


def job_file(tmp_path: Path, cluster, faults: list[Fault], max_restarts: int, instance_count: int = 2,
             hyperparameters: dict | None = None, **slurm) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
        "instance_count": instance_count, "processes_per_host": 1, "backend": "slurm",
        "base_job_name": "slurm-restarts",
        "slurm": {"partition": cluster.partition, "time": "15:00", **slurm},
        "distribution": {"torch_distributed": {"enabled": True}}, "max_restarts": max_restarts,
        "output_path": str(tmp_path / "artifacts"), "hyperparameters": {**HP, **(hyperparameters or {})},
        "environment": {FAULT_ENV: fault_spec(*faults)}}))
    return job


def submitted(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    line = next(x for x in proc.stdout.splitlines() if x.startswith("submitted "))
    return line.split()[1], line.split("Slurm job ")[1].split(")")[0]


def submit(tmp_path: Path, cluster, home: Path, faults: list[Fault], max_restarts: int, instance_count: int = 2,
           **slurm) -> tuple:
    """Run the job to its end with `smlaunch submit`: (process, job name, Slurm job id, seconds)."""
    job = job_file(tmp_path, cluster, faults, max_restarts, instance_count, **slurm)
    started = time.monotonic()
    proc = smlaunch("submit", str(job), env={**cli_env(home), **cluster.env}, timeout=500)
    return (proc, *submitted(proc), time.monotonic() - started)


def last_per_step(records: list[dict]) -> dict[int, float]:
    """Each step's loss as the run finally logged it (a replayed step is logged again)."""
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_a_killed_then_a_hung_rank_restart_and_the_job_ends_like_an_uninterrupted_run(
        tmp_path, slurm_cluster):
    home = tmp_path / "home"
    proc, name, job_id, _ = submit(tmp_path, slurm_cluster, home, [KILLED, HUNG], max_restarts=2)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert slurm_cluster.wait_ended(job_id, timeout=60) == "COMPLETED"
    log = (home / "jobs" / name / "logs" / "job.log").read_text()
    assert "restart 1 of 2 (max_restarts)" in log and "restart 2 of 2 (max_restarts)" in log
    assert "step 6 did not complete within 5 s" in log  # the hang was found by the step watchdog

    status = smlaunch("status", f"slurm:{job_id}", env={**cli_env(home), **slurm_cluster.env}).stdout
    assert f"{name}: Completed\n" in status and "restarts: 2 of 2 (max_restarts)" in status, status
    attempts = [line for line in status.splitlines() if line.lstrip().startswith("attempt ")]
    assert len(attempts) == 2, status
    assert "attempt 0 failed at step 2" in attempts[0] and "SIGKILL" in attempts[0] and "restarted" in attempts[0]
    assert "attempt 1 failed at step 5" in attempts[1] and "restarted" in attempts[1]
    assert "step 6 did not complete" in attempts[1] or "rank 0" in attempts[1], attempts[1]

    out = tmp_path / "artifacts" / name / "output"
    records = [json.loads(x) for x in members(out / "output.tar.gz")["metrics.jsonl"].decode().splitlines()]
    reference = run_train(tmp_path / "ref", 2, **{**HP, "checkpoint_dir": None, "step_timeout": None})
    assert sorted(last_per_step(records)) == list(range(1, HP["max_steps"] + 1))
    # the same ranks, data and order after each restart: the fp32 losses are the same numbers
    assert last_per_step(records) == last_per_step(reference)
    assert len(series(records, "loss")) > HP["max_steps"]  # control: steps were replayed, not skipped
    assert processes_in(home / "jobs" / name) == []


def test_without_restarts_the_killed_rank_fails_the_slurm_job_at_once(tmp_path, slurm_cluster):
    home = tmp_path / "home"
    proc, name, job_id, _ = submit(tmp_path, slurm_cluster, home, [KILLED, HUNG], max_restarts=0)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert slurm_cluster.wait_ended(job_id, timeout=60) == "FAILED"
    record = store.read(name, home / "jobs")
    assert record["TrainingJobStatus"] == "Failed" and "SIGKILL" in record["FailureReason"], record
    log = (home / "jobs" / name / "logs" / "job.log").read_text()
    assert "restart 1" not in log and "[metrics] step=3 " not in log  # no step after the kill
    assert "[metrics] step=2 " in log  # control: it did train up to the fault
    assert processes_in(home / "jobs" / name) == []


def test_a_nodes_lost_processes_restart_its_host_on_a_spare_node(tmp_path, slurm_cluster):
    """One host and one spare node (the test cluster has two): the host's processes are killed
    (its bootstrap, torchrun and rank: the step's task dies by SIGKILL, as on a lost node), and
    the supervisor starts the host again on the spare node, where it resumes."""
    home = tmp_path / "home"
    lost = Fault("host", rank=0, step=3, attempt=0)
    proc, name, job_id, _ = submit(tmp_path, slurm_cluster, home, [lost], max_restarts=1, instance_count=1,
                                   spare_nodes=1)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert slurm_cluster.wait_ended(job_id, timeout=60) == "COMPLETED"
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    assert "NumNodes=2 " in shown and "NodeList=n[1-2]" in shown  # the host's node and the spare
    log = (home / "jobs" / name / "logs" / "job.log").read_text()
    assert "algo-1 was killed by SIGKILL without a failure report" in log
    assert "algo-1 moves from node n1 to spare node n2" in log and "restart 1 of 1" in log
    # Slurm ran the first step on n1, the restarted one on n2 (each slurmd logs the steps it launches)
    launched = {node: (slurm_cluster.logs / f"slurmd-{node}.log").read_text() for node in ("n1", "n2")}
    assert f"launch task StepId={job_id}.0 " in launched["n1"] and f"StepId={job_id}.0 " not in launched["n2"]
    assert f"launch task StepId={job_id}.1 " in launched["n2"]

    status = smlaunch("status", f"slurm:{job_id}", env={**cli_env(home), **slurm_cluster.env}).stdout
    assert f"{name}: Completed\n" in status and "restarts: 1 of 1 (max_restarts)" in status, status
    assert "(fault, restarted): algo-1 was killed by SIGKILL without a failure report" in status, status
    assert "resumed from step 2" in status  # the checkpoint before the fault at step 3
    out = tmp_path / "artifacts" / name / "output"
    records = [json.loads(x) for x in members(out / "output.tar.gz")["metrics.jsonl"].decode().splitlines()]
    reference = run_train(tmp_path / "ref", 1, **{**HP, "train_batch_size": 2, "checkpoint_dir": None,
                                                 "step_timeout": None})
    assert sorted(last_per_step(records)) == list(range(1, HP["max_steps"] + 1))
    assert last_per_step(records) == last_per_step(reference)
    assert processes_in(home / "jobs" / name) == []


def test_a_failed_node_leaves_the_allocation_and_its_host_moves_to_the_spare(tmp_path, three_nodes):
    """Two hosts and a spare on n1..n3: while rank 1 (on n2) is held at step 4, n2 fails: Slurm
    takes it DOWN (out of the job's allocation, which --no-kill keeps) and its processes die with
    it. The supervisor restarts the job with algo-2 on n3; it ends COMPLETED on n1 and n3."""
    home, env = tmp_path / "home", {**cli_env(tmp_path / "home"), **three_nodes.env}
    held = Fault("hang", rank=1, step=4, attempt=0)  # keeps the job at step 4 until the node fails
    job = job_file(tmp_path, three_nodes, [held], max_restarts=1, spare_nodes=1,
                   hyperparameters={"step_timeout": 300})  # the node fails long before a hang is declared
    proc = smlaunch("submit", str(job), "--no-wait", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    name, job_id = submitted(proc)
    job_dir = home / "jobs" / name
    log = job_dir / "logs" / "job.log"
    try:
        wait_for(lambda: log.is_file() and "hang on rank 1 at step 4" in log.read_text(), timeout=240)
        on_n2 = processes_in(job_dir / "hosts" / "algo-2")  # n2's bootstrap, torchrun and rank
        three_nodes.run("scontrol", "update", "nodename=n2", "state=down", "reason=smlaunch-test")
        # Slurm ends the step (srun: "Node failure on n2"); the processes, on this machine, live on:
        # once the host is restarted elsewhere they die, as they would have with the node
        wait_for(lambda: "moves from node n2" in log.read_text(), timeout=120)
        for pid in on_n2:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: store.read(name, home / "jobs")["TrainingJobStatus"] != "InProgress", timeout=300)
    finally:
        if store.read(name, home / "jobs")["TrainingJobStatus"] == "InProgress":
            smlaunch("stop", name, env=env)
        three_nodes.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    text = log.read_text()
    assert store.read(name, home / "jobs")["TrainingJobStatus"] == "Completed", text[-4000:]
    assert three_nodes.wait_ended(job_id, timeout=60) == "COMPLETED"
    assert "algo-2 moves from node n2 to spare node n3" in text
    shown = three_nodes.run("scontrol", "show", "job", "-o", job_id).stdout
    assert "NodeList=n[1,3]" in shown, shown  # n2 left the allocation
    status = smlaunch("status", name, env=env).stdout
    assert "restarts: 1 of 1 (max_restarts)" in status and "algo-2 was killed by SIGKILL" in status, status
    assert on_n2 and all(not Path(f"/proc/{pid}").exists() for pid in on_n2)
    assert processes_in(job_dir) == []


def test_a_failed_node_with_no_spare_leaves_the_job_on_the_node_left(tmp_path, slurm_cluster):
    """min_instance_count 1 on n1 and n2, no spare: while rank 1 (on n2) is held at step 4, n2 fails
    (DOWN, out of the allocation that --no-kill keeps). The job goes on with algo-1 alone from the
    step-2 checkpoint, accumulating the lost rank's share, and ends COMPLETED with an uninterrupted
    run's losses (steps 3-8 within test_resume_world_size's 1e-5: one rank sums two micro-batches)."""
    home, env = tmp_path / "home", {**cli_env(tmp_path / "home"), **slurm_cluster.env}
    held = Fault("hang", rank=1, step=4, attempt=0)
    job = job_file(tmp_path, slurm_cluster, [held], max_restarts=1, hyperparameters={"step_timeout": 300})
    job.write_text(yaml.safe_dump({**yaml.safe_load(job.read_text()), "min_instance_count": 1}))
    proc = smlaunch("submit", str(job), "--no-wait", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    name, job_id = submitted(proc)
    job_dir = home / "jobs" / name
    log = job_dir / "logs" / "job.log"
    try:
        wait_for(lambda: log.is_file() and "hang on rank 1 at step 4" in log.read_text(), timeout=240)
        on_n2 = processes_in(job_dir / "hosts" / "algo-2")
        slurm_cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=smlaunch-test")
        wait_for(lambda: "host(s) left" in log.read_text(), timeout=120)
        for pid in on_n2:  # on this machine they outlive their node: end them as the node's failure would
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: store.read(name, home / "jobs")["TrainingJobStatus"] != "InProgress", timeout=300)
    finally:
        if store.read(name, home / "jobs")["TrainingJobStatus"] == "InProgress":
            smlaunch("stop", name, env=env)
        slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    text = log.read_text()
    assert store.read(name, home / "jobs")["TrainingJobStatus"] == "Completed", text[-4000:]
    assert slurm_cluster.wait_ended(job_id, timeout=60) == "COMPLETED"
    assert "node n2 of algo-2 has left the allocation and no spare node is left" in text
    assert "gradient_accumulation_steps 1 -> 2" in text
    status = smlaunch("status", name, env=env).stdout
    assert "shrank from 2 to 1 host(s) at step 3 after attempt 0 (algo-2 gone; min_instance_count)" in status, status
    out = tmp_path / "artifacts" / name / "output"
    records = [json.loads(x) for x in members(out / "output.tar.gz")["metrics.jsonl"].decode().splitlines()]
    reference = last_per_step(run_train(tmp_path / "ref", 2, **{**HP, "checkpoint_dir": None, "step_timeout": None}))
    losses = last_per_step(records)
    assert sorted(losses) == list(range(1, HP["max_steps"] + 1))
    assert [losses[s] for s in (1, 2)] == [reference[s] for s in (1, 2)]  # before the checkpoint it resumed from
    after = range(3, HP["max_steps"] + 1)
    assert [losses[s] for s in after] == pytest.approx([reference[s] for s in after], rel=1e-5)
    assert processes_in(job_dir) == []
