"""Automatic restarts of a local job as a user runs it (`smlaunch submit`, two simulated hosts, the
process runner): a job with max_restarts that meets a killed, a hung and a frozen rank and a lost host ends
Completed by itself with the uninterrupted run's losses; without restarts the same fault fails it
fast; a fault that comes back at the same step stops, a killed rank or a lost host alike; an error
of the job is never retried. However a host ended, its ranks' raw output is gone with the job, and
nothing was left in TMPDIR. Faults are injected through launcher.wire.faults (SMLAUNCH_FAULT_INJECTION)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from launcher.cli.jobview import restart_lines
from launcher.wire.faults import FAULT_ENV, Fault, fault_spec
from launcher.wire.opt_ml import SCRATCH_DIR
from tests.support.local_jobs import cli_env, script_job, smlaunch
from tests.support.train_runs import ROOT, run_train

# fp32 on CPU, synthetic data: a resume is exact, so the steps after a restart equal the
# uninterrupted run's bit for bit (tests/integration/test_train_resume.py holds the resume itself)
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 10,
      "train_batch_size": 2, "lr": 0.03, "warmup": 0.0, "seed": 7, "logging_freq": 1, "checkpoint_freq": 2,
      "step_timeout": 5, "collective_timeout": 120}


def _job(tmp_path: Path, *faults: Fault, max_restarts: int = 0, hosts: int = 2, **fields) -> Path:
    data = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
            "instance_count": hosts, "processes_per_host": 2 // hosts,
            "distribution": {"torch_distributed": {"enabled": True}}, "hyperparameters": HP,
            "max_restarts": max_restarts, "max_run": 600, **fields}
    if faults:
        data["environment"] = {FAULT_ENV: fault_spec(*faults)}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _submit(tmp_path: Path, job: Path) -> tuple[object, dict, Path]:
    (tmp_path / "tmp").mkdir()
    env = cli_env(tmp_path / "home", TMPDIR=str(tmp_path / "tmp"))
    done = smlaunch("submit", str(job), env=env, timeout=600)
    name = next((tmp_path / "home" / "jobs").iterdir()).name
    status = smlaunch("status", name, "--json", env=env)
    assert status.returncode in (0, 1), status.stderr  # 1: the job failed
    job_dir = tmp_path / "home" / "jobs" / name
    # a host killed by SIGKILL runs no cleanup: nothing of it in TMPDIR, and its scratch went with the job
    assert list((tmp_path / "tmp").glob("smlaunch-*")) == []
    assert list(job_dir.glob(f"hosts/*/{SCRATCH_DIR}")) == []
    return done, json.loads(status.stdout), job_dir


def _losses(job_dir: Path) -> dict[int, float]:
    """Each step's loss as the job's last attempt to run it logged it (rank 0's metrics.jsonl)."""
    out = {}
    for line in (job_dir / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            out[record["step"]] = record["loss"]
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    """The job's two ranks run once without faults, as train.py's ranks forked from the fork server:
    the same numbers as a submitted job (tests/e2e/test_slurm_restarts.py compares them so), for a
    fifth of its CPU (no CLI, supervisor, bootstraps or torchruns, nor two fresh imports of torch).
    That a job without faults records no restarts is test_local_mode's control."""
    # None: run_train's TINY sets a min_lr, which the job's HP does not
    records = run_train(tmp_path_factory.mktemp("uninterrupted"), 2, **{"min_lr": None, **HP})
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_a_killed_hung_frozen_rank_and_a_lost_host_restart_and_the_run_ends_as_uninterrupted(tmp_path,
                                                                                           uninterrupted):
    job = _job(tmp_path, Fault("signal", 1, 3, attempt=0), Fault("hang", 0, 6, attempt=1),
               Fault("host", 1, 8, attempt=2), Fault("stop", 1, 9, attempt=3), max_restarts=4)
    done, desc, job_dir = _submit(tmp_path, job)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert desc["TrainingJobStatus"] == "Completed"
    restarts = desc["Restarts"]
    assert [r["attempt"] for r in restarts] == [0, 1, 2, 3]
    assert all(r["restarted"] and r["failure_class"] == "fault" for r in restarts)
    assert "SIGKILL" in restarts[0]["reason"]
    assert restarts[1]["detail"] == "hung" and "hung: step 6 did not complete" in restarts[1]["reason"]
    assert restarts[2]["detail"] == "host lost" and restarts[2]["host"] == "algo-2"
    assert restarts[3]["detail"] == "frozen" and "stopped (SIGSTOP?)" in restarts[3]["reason"]
    # each restart resumed from a checkpoint at or before the failure, and trained again: the frozen
    # rank, once continued, and its peers, whose watchdogs had declared the hang, trained and saved no more
    for r in restarts:
        assert r["extra"]["resumed_from"] <= r["step"] and "down_s" in r["extra"]
    assert _losses(job_dir) == uninterrupted  # every step, the replayed ones as the uninterrupted run's
    # rank 0 told its trackers: an event at each resumed step, and a restarts series in the records
    records = [json.loads(line) for line in (job_dir / "hosts" / "algo-1" / "output" / "data"
                                              / "metrics.jsonl").read_text().splitlines()]
    assert [r["restarts"] for r in records if "restart_reason" in r] == [1, 2, 3, 4]
    assert records[-1]["restarts"] == 4 and "restarts" not in records[0]
    text = smlaunch("status", desc["TrainingJobName"], env=cli_env(tmp_path / "home")).stdout
    assert "restarts: 4 of 4 (max_restarts)" in text and "goodput" in text
    # the hang left every rank's stacks, and the diagnosis names the rank that hung
    diag = smlaunch("logs", desc["TrainingJobName"], "--diagnostics", env=cli_env(tmp_path / "home")).stdout
    assert "attempt 1" in diag and "rank 0" in diag and "at_step" in diag


def test_without_restarts_a_killed_rank_fails_the_job_as_before(tmp_path):
    done, desc, job_dir = _submit(tmp_path, _job(tmp_path, Fault("signal", 1, 3)))
    assert done.returncode != 0
    assert desc["TrainingJobStatus"] == "Failed" and "killed by SIGKILL" in desc["FailureReason"]
    assert [r["restarted"] for r in desc["Restarts"]] == [False]
    assert "restart 1" not in (job_dir / "logs" / "job.log").read_text()


def test_a_fault_that_comes_back_at_the_same_step_stops(tmp_path):
    done, desc, _ = _submit(tmp_path, _job(tmp_path, Fault("exit", 1, 5), max_restarts=3))
    assert desc["TrainingJobStatus"] == "Failed"
    classes = [(r["attempt"], r["failure_class"], r["restarted"]) for r in desc["Restarts"]]
    assert classes == [(0, "fault", True), (1, "repeated", False)]  # one restart, not three
    assert "not restarted (repeated" in desc["FailureReason"]
    assert "earlier failures: attempt 0 failed at step 4" in desc["FailureReason"]


def test_a_host_lost_at_the_same_step_stops_as_a_killed_rank_does(tmp_path):
    # one host of two ranks: the supervisor restarts it alone, without a peer to wait for
    done, desc, _ = _submit(tmp_path, _job(tmp_path, Fault("host", 1, 3), max_restarts=3, hosts=1))
    assert desc["TrainingJobStatus"] == "Failed"
    classes = [(r["attempt"], r["failure_class"], r["restarted"], r["detail"]) for r in desc["Restarts"]]
    assert classes == [(0, "fault", True, "host lost"), (1, "repeated", False, "host lost")]  # one restart, not three
    assert desc["FailureReason"].startswith("AlgorithmError: algo-1 was killed by SIGKILL without a failure report; "
                                            "not restarted (repeated: ")
    assert "earlier failures: attempt 0 failed at step 2 (fault, restarted): algo-1 was killed" in desc["FailureReason"]


def test_a_host_gone_for_good_leaves_the_job_on_the_host_left_with_the_uninterrupted_runs_steps(tmp_path,
                                                                                                uninterrupted):
    """min_instance_count 1: rank 1's host is gone at step 5 for good, and the job goes on with one host of
    one rank from the step-4 checkpoint, taking the lost rank's share by gradient accumulation."""
    job = _job(tmp_path, Fault("host-gone", 1, 5, attempt=0), max_restarts=1, min_instance_count=1)
    done, desc, job_dir = _submit(tmp_path, job)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert desc["TrainingJobStatus"] == "Completed"
    assert desc["Shrinks"] == [{"from": 2, "to": 1, "step": 4, "attempt": 0, "host": "algo-2"}]
    assert [(r["detail"], r["restarted"], r["extra"]["resumed_from"]) for r in desc["Restarts"]] == [
        ("host lost", True, 4)]
    log = (job_dir / "logs" / "job.log").read_text()
    assert "algo-2 cannot come back" in log and "gradient_accumulation_steps 1 -> 2" in log
    events = [json.loads(line).get("restart_reason", "") for line in (
        job_dir / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    assert [e for e in events if e][0].endswith("the job goes on with 1 host(s) (min_instance_count)")  # trackers
    losses = _losses(job_dir)
    assert sorted(losses) == sorted(uninterrupted)
    assert [losses[s] for s in range(1, 5)] == [uninterrupted[s] for s in range(1, 5)]  # before the loss: the same run
    after = range(5, HP["max_steps"] + 1)  # one rank's two micro-batches: a sum in another order
    assert [losses[s] for s in after] == pytest.approx([uninterrupted[s] for s in after], rel=1e-5)
    text = smlaunch("status", desc["TrainingJobName"], env=cli_env(tmp_path / "home")).stdout
    assert "shrank from 2 to 1 host(s) at step 4 after attempt 0 (algo-2 gone; min_instance_count)" in text
    # the control: the batch rule is what lets one rank continue the job's checkpoints; without the
    # original world, it keeps its own accumulation and the resume refuses the global batch it would change
    shutil.copytree(job_dir / "checkpoints", tmp_path / "control" / "checkpoints")
    with pytest.raises(AssertionError, match=r"global batch in sequences per step was 4 when saved, now 2"):
        run_train(tmp_path / "control", 1, **{"min_lr": None, **HP, "max_steps": HP["max_steps"] + 2})


def test_an_error_of_the_job_is_not_restarted(tmp_path):
    job = script_job(tmp_path, max_restarts=2, environment={"FAIL_RANK": "1", "SLEEP": "30"})
    env = cli_env(tmp_path / "home")
    done = smlaunch("submit", str(job), env=env, timeout=300)
    assert done.returncode != 0
    name = next((tmp_path / "home" / "jobs").iterdir()).name
    desc = json.loads(smlaunch("status", name, "--json", env=env).stdout)
    assert [(r["failure_class"], r["restarted"]) for r in desc["Restarts"]] == [("job error", False)]
    assert "ValueError is an error of the job" in desc["FailureReason"]


RULES_SCRIPT = """
import os, sys
attempt, rank = os.environ["SMLAUNCH_ATTEMPT"], os.environ["RANK"]
if attempt == "0" and rank == "1":
    sys.exit(3)  # the script's own "restart me"
if attempt == "1" and rank == "0":
    raise ValueError("a flaky source of the job's own")
"""


@pytest.mark.parametrize("rules", [True, False], ids=["rules", "control"])
def test_the_jobs_own_recovery_rules_restart_an_exit_code_uncounted_and_retry_a_job_error(tmp_path, rules):
    """restart_on_exit_codes [3] restarts attempt 0's exit code 3 without counting it, and
    restart_on_job_errors 1 retries attempt 1's ValueError as the one restart max_restarts 1 allows:
    the job completes at attempt 2. Without the exit-code rule (control), exit code 3 is a fault that
    uses the one restart, and the ValueError then ends the job. One host of two ranks: ~10 s a job."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "job.py").write_text(RULES_SCRIPT)
    data = {"entry_point": "job.py", "source_dir": str(tmp_path / "src"), "instance_type": "local",
            "processes_per_host": 2, "distribution": {"torch_distributed": {"enabled": True}},
            "max_restarts": 1, "restart_on_job_errors": 1, **({"restart_on_exit_codes": [3]} if rules else {})}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    done, desc, _ = _submit(tmp_path, tmp_path / "job.yaml")
    classes = [(r["attempt"], r["failure_class"], r["restarted"]) for r in desc["Restarts"]]
    if rules:
        assert desc["TrainingJobStatus"] == "Completed", done.stdout[-3000:]
        assert classes == [(0, "requested", True), (1, "job error", True)]
        assert restart_lines(desc)[0] == ("restarts: 1 of 1 (max_restarts), and 1 an exit code of "
                                          "restart_on_exit_codes asked for")
    else:
        assert desc["TrainingJobStatus"] == "Failed"
        assert classes == [(0, "fault", True), (1, "job error", False)]
        assert "not restarted: all 1 restarts (max_restarts) used" in desc["FailureReason"]


SILENT_SCRIPT = """
import faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1)  # a script that wants its Python stacks in the diagnostics
if os.environ["SMLAUNCH_ATTEMPT"] == "0":
    print("rank", os.environ["RANK"], "waits for a peer that never answers", flush=True)
    time.sleep(600)  # no CPU, no output: as a rank blocked in a collective
for second in range(8):  # the control: longer than hang_timeout, but it writes
    print("working", second, flush=True)
    time.sleep(2)
"""


def test_a_script_of_your_own_that_goes_silent_is_a_hang_with_its_stacks_and_is_restarted(tmp_path):
    """hang_timeout 10: attempt 0's ranks sleep without a word and are stopped as hung, their stacks
    in the attempt's diagnostics, and restarted; attempt 1 runs 16 s, past the timeout, printing
    every 2 s, and completes (the control: output keeps a script alive). ~35 s."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "job.py").write_text(SILENT_SCRIPT)
    data = {"entry_point": "job.py", "source_dir": str(tmp_path / "src"), "instance_type": "local",
            "processes_per_host": 2, "distribution": {"torch_distributed": {"enabled": True}},
            "max_restarts": 1, "hang_timeout": 10}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    done, desc, job_dir = _submit(tmp_path, tmp_path / "job.yaml")
    assert desc["TrainingJobStatus"] == "Completed", done.stdout[-3000:]
    (record,) = desc["Restarts"]
    assert (record["attempt"], record["failure_class"], record["detail"], record["restarted"]) == (
        0, "fault", "hung", True)
    assert "used no CPU and wrote nothing for 1" in record["reason"]
    diagnostics = job_dir / "hosts" / "algo-1" / "output" / "data" / "diagnostics" / "attempt-0"
    stacks = sorted(diagnostics.glob("rank-*.txt"))
    sleeping = 'job.py", line 6 in <module>'  # the script's time.sleep(600), as faulthandler names it
    assert len(stacks) == 2 and all(sleeping in p.read_text() for p in stacks), [p.read_text() for p in stacks]
