"""Local jobs on a real user's machine (issue 31, items 1-6): a reused pid is never signalled, a
full disk ends the job cleanly, a finished entry process finishes the job, damaged records hide
nothing. Each test drives the CLI as a user does, with a tiny script as the job."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.local_jobs import cli_env, smlaunch, wait_for


def _job(tmp_path: Path, script: str, **fields) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "job.py").write_text(script)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"entry_point": "job.py", "source_dir": str(src), "instance_type": "local",
                                    **fields}))
    return path


def _record(home: Path, name: str) -> dict:
    return json.loads((home / "jobs" / name / "job.json").read_text())


def _rewrite(home: Path, name: str, **fields) -> None:
    path = home / "jobs" / name / "job.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.fixture
def done_job(tmp_path):
    """(env, home, name) of a job that ran and completed."""
    home = tmp_path / "home"
    env = cli_env(home)
    submitted = smlaunch("submit", str(_job(tmp_path, "print('hi')\n")), "--job-name", "done", env=env)
    assert submitted.returncode == 0, submitted.stderr
    return env, home, "done"


@pytest.fixture
def bystander():
    """A process that is not the job's: the pid a reused SupervisorPid now names."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _start_ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[19])


# --- 1. PID reuse ----------------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process identity needs /proc (Linux)")
def test_a_reused_supervisor_pid_is_never_signalled_and_the_job_fails(done_job, bystander):
    env, home, name = done_job
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    # The record of a job whose supervisor and watchdog died, their pids since taken by a bystander.
    gone = {"Pid": bystander.pid, "StartTicks": _start_ticks(bystander.pid) - 1, "BootId": boot}
    _rewrite(home, name, TrainingJobStatus="InProgress", SecondaryStatus="Training", SupervisorPid=bystander.pid,
             WatchdogPid=bystander.pid, SupervisorProcess=gone, WatchdogProcess=gone)
    stop = smlaunch("stop", name, env=env)
    time.sleep(0.5)
    assert bystander.poll() is None, "stop signalled a process that is not the job's"
    assert stop.returncode == 1 and "has already ended (Failed)" in stop.stderr, stop.stderr
    status = smlaunch("status", name, env=env)
    assert status.returncode == 1 and "Failed" in status.stdout
    reason = _record(home, name)["FailureReason"]
    assert f"pid {bystander.pid} now belongs to another process" in reason, reason
    listed = smlaunch("list", "--local", env=env)
    assert "Failed" in listed.stdout and "InProgress" not in listed.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process identity needs /proc (Linux)")
def test_stop_signals_the_supervisor_whose_identity_matches(done_job, bystander):
    """The control: the recorded process, still running, gets the stop's SIGTERM."""
    env, home, name = done_job
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    same = {"Pid": bystander.pid, "StartTicks": _start_ticks(bystander.pid), "BootId": boot}
    _rewrite(home, name, TrainingJobStatus="InProgress", SecondaryStatus="Training", SupervisorPid=bystander.pid,
             SupervisorProcess=same)
    stop = smlaunch("stop", name, env=env)
    assert stop.returncode == 0, stop.stderr
    assert bystander.wait(timeout=10) == -signal.SIGTERM


# --- 6. damaged records ----------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["[]", '{"TrainingJobName": "bad", "TrainingJobStatus": 7}', "{not json"])
def test_a_damaged_record_hides_no_other_job_and_status_says_so(done_job, damage):
    env, home, _ = done_job
    (home / "jobs" / "bad").mkdir()
    (home / "jobs" / "bad" / "job.json").write_text(damage)
    listed = smlaunch("list", "--local", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    out = json.loads(listed.stdout)
    assert [j["TrainingJobName"] for j in out["jobs"]] == ["done"]
    assert out["notes"] == [f"local: 1 damaged job record(s) not listed: {home / 'jobs' / 'bad' / 'job.json'}"]
    status = smlaunch("status", "bad", env=env)
    assert status.returncode == 2 and "Traceback" not in status.stderr
    assert f"{home / 'jobs' / 'bad' / 'job.json'} is damaged" in status.stderr, status.stderr


def test_a_job_deleted_while_it_is_reconciled_is_not_recreated(done_job, monkeypatch):
    """`status` of a job whose supervisor is gone rewrites its record; a job deleted between the
    read and the write stays deleted."""
    from launcher.backends.base import BackendError
    from launcher.backends.local import LocalBackend
    from launcher.local import store

    env, home, name = done_job
    _rewrite(home, name, TrainingJobStatus="InProgress", SupervisorPid=2 ** 22 + 1)
    backend = LocalBackend(root=home / "jobs")
    real_merged = store.merged

    def deleted_meanwhile(directory, **fields):
        record = real_merged(directory, **fields)
        shutil.rmtree(directory)
        return record

    monkeypatch.setattr(store, "merged", deleted_meanwhile)
    with pytest.raises(BackendError, match="was deleted"):
        backend.describe(name)
    monkeypatch.undo()
    assert not (home / "jobs" / name).exists()
    listed = smlaunch("list", "--local", "--json", env=env)
    assert listed.returncode == 0 and json.loads(listed.stdout)["jobs"] == []


def test_list_fails_when_a_backend_asked_for_cannot_be_listed(done_job):
    env, home, _ = done_job
    env = {**env, "PATH": "/nonexistent"}  # no squeue: Slurm cannot be asked
    env.pop("AWS_DEFAULT_REGION", None)
    listed = smlaunch("list", "--backend", "local", "--backend", "sagemaker", env=env)
    assert listed.returncode == 1 and "sagemaker: not listed" in listed.stderr
    everything = smlaunch("list", env=env)  # SageMaker unconfigured on a machine of local jobs: a note
    assert everything.returncode == 0 and "done" in everything.stdout


# --- 2. a disk that fills during the job -----------------------------------------------------

LOUD = "for i in range(40000):\n    print(f'line {i} ' + 'x' * 100)\nprint('entry done', flush=True)\n"


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB file system for SMLAUNCH_HOME (root only: a tmpfs mount)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        pytest.skip("a full disk needs a tmpfs mount: run as root on Linux")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(directory: Path) -> None:
    with open(directory / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_job_whose_logs_fill_the_disk_fails_naming_it(tmp_path, small_disk):
    home = small_disk / "home"
    env = cli_env(home)
    submitted = smlaunch("submit", str(_job(tmp_path, LOUD)), "--job-name", "full", env=env, timeout=120)
    assert submitted.returncode == 1, submitted.stderr
    assert "Traceback" not in submitted.stdout + submitted.stderr
    log = home / "jobs" / "full" / "logs"
    assert submitted.stdout.count("log output is dropped from here on") == 1
    record = _record(home, "full")
    assert record["TrainingJobStatus"] == "Failed"
    assert record["FailureReason"].startswith("ClientError: no space left on device: could not write "
                                              f"{log}/"), record["FailureReason"]
    status = smlaunch("status", "full", env=env)
    assert status.returncode == 1 and "no space left on device" in status.stdout
    listed = smlaunch("list", "--local", env=env)
    assert listed.returncode == 0 and "Failed" in listed.stdout


def test_status_and_list_answer_when_the_record_cannot_be_rewritten(done_job, small_disk):
    env, home, name = done_job
    job = small_disk / "home" / "jobs" / name
    shutil.copytree(home / "jobs" / name / "logs", job / "logs")  # the record and its job on the small disk
    shutil.copy(home / "jobs" / name / "job.json", job / "job.json")
    env = cli_env(small_disk / "home")
    _rewrite(small_disk / "home", name, TrainingJobStatus="InProgress", SupervisorPid=2 ** 22 + 1)
    _fill(small_disk)  # and no reserve left: the reconcile's write fails
    status = smlaunch("status", name, env=env)
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    assert f"{name}: Failed" in status.stdout and "could not be rewritten: [Errno 28]" in status.stdout
    listed = smlaunch("list", "--local", env=env)
    assert listed.returncode == 0 and "Failed" in listed.stdout, listed.stderr
    assert _record(small_disk / "home", name)["TrainingJobStatus"] == "InProgress"  # read-only
    (small_disk / "filler").unlink()
    assert smlaunch("status", name, env=env).returncode == 1
    assert _record(small_disk / "home", name)["TrainingJobStatus"] == "Failed"  # written once it can be


# --- 3. a finished job that never finishes ---------------------------------------------------

HELPER_LEFT_RUNNING = """
import os, subprocess, sys
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session={session})
open(os.environ["HELPER_PID"], "w").write(str(helper.pid))
print("entry done", flush=True)
sys.exit({code})
"""


@pytest.mark.parametrize(("session", "code", "status"), [(False, 0, "Completed"), (True, 3, "Failed")])
def test_a_job_ends_when_its_entry_process_does(tmp_path, session, code, status):
    """A helper holding the entry process's stdout (in its group, or in a session of its own) does
    not keep the job running: it ends with the entry process's exit code, the helper ended."""
    home = tmp_path / "home"
    pid_file = tmp_path / "helper.pid"
    job = _job(tmp_path, HELPER_LEFT_RUNNING.format(session=session, code=code),
               environment={"HELPER_PID": str(pid_file)})
    started = time.monotonic()
    submitted = smlaunch("submit", str(job), "--job-name", "ends", env=cli_env(home), timeout=120)
    took = time.monotonic() - started
    record = _record(home, "ends")
    assert record["TrainingJobStatus"] == status, submitted.stdout + submitted.stderr
    assert took < 30, f"{took:.0f} s"  # the drain grace (5 s) and the leftovers' (2 + 2 s), and start-up
    if code:
        assert f"ExitCode {code}" in record["FailureReason"], record["FailureReason"]
    helper = int(pid_file.read_text())
    assert not Path(f"/proc/{helper}").exists() or "Z" in Path(f"/proc/{helper}/stat").read_text().split()[2]


# --- 5. a frozen rank ------------------------------------------------------------------------

FREEZES = """
import datetime, os, signal
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
if dist.get_rank() == 1:
    print("rank 1 freezes", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
dist.all_reduce(torch.ones(1))
"""


def test_a_frozen_rank_is_ended_and_named(tmp_path):
    """Rank 1 stops itself (SIGSTOP); rank 0's collective times out. Without help torchrun would
    wait its 100 s shutdown timeout for the stopped rank; the job fails within seconds instead,
    naming the rank that did not report."""
    home = tmp_path / "home"
    job = _job(tmp_path, FREEZES, processes_per_host=2, distribution={"torch_distributed": {"enabled": True}})
    started = time.monotonic()
    submitted = smlaunch("submit", str(job), "--job-name", "frozen", env=cli_env(home), timeout=150)
    took = time.monotonic() - started
    record = _record(home, "frozen")
    assert record["TrainingJobStatus"] == "Failed", submitted.stdout + submitted.stderr
    assert took < 60, f"{took:.0f} s"  # the 3 s timeout, 5 s to SIGCONT, 5 more to SIGKILL, and start-up
    assert "rank 1 (local rank 1" in record["FailureReason"] and "did not report" in record["FailureReason"], \
        record["FailureReason"]


SLOW_TO_STOP = """
import os, signal, sys, time
if os.environ["SM_CURRENT_HOST"] == "algo-2":
    sys.exit("algo-2 fails")
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(4), sys.exit(0)))
time.sleep(600)
"""


def test_the_job_is_recorded_failed_when_its_first_host_fails(tmp_path):
    """algo-2 fails at once; algo-1 takes 4 s to stop. The record says Failed (with algo-2's
    reason) while algo-1 is still being stopped, and the outcome follows once it has."""
    home = tmp_path / "home"
    env = cli_env(home)
    job = _job(tmp_path, SLOW_TO_STOP, instance_count=2)
    assert smlaunch("submit", str(job), "--job-name", "first", "--no-wait", env=env).returncode == 0
    early = wait_for(lambda: (r := _record(home, "first"))["TrainingJobStatus"] == "Failed" and r, timeout=60)
    assert "algo-2" in early["FailureReason"] and "TrainingEndTime" not in early
    assert early["SecondaryStatus"] == "Stopping"
    final = wait_for(lambda: (r := _record(home, "first")).get("TrainingEndTime") and r, timeout=90)
    assert final["TrainingJobStatus"] == "Failed" and final["FailureReason"] == early["FailureReason"]
    assert final["HostExitCodes"]["algo-2"] != 0


# --- 4. escaped descendants ------------------------------------------------------------------

DAEMONIZES = """
import os, subprocess, sys
daemon = ("import os, sys, time\\nif os.fork():\\n    sys.exit(0)\\nos.setsid()\\n"
          "open(sys.argv[1], 'w').write(str(os.getpid()))\\ntime.sleep(600)")
# A daemon: an empty environment (no job mark), a session of its own, its parent gone at once.
subprocess.run(["env", "-i", sys.executable, "-c", daemon, os.environ["HELPER_PID"]],
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print("entry done", flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is a Linux feature")
@pytest.mark.parametrize("no_wait", [False, True])
def test_a_daemon_without_the_job_mark_does_not_outlive_the_job(tmp_path, no_wait):
    home = tmp_path / "home"
    env = cli_env(home)
    pid_file = tmp_path / "daemon.pid"
    job = _job(tmp_path, DAEMONIZES, environment={"HELPER_PID": str(pid_file)})
    submitted = smlaunch("submit", str(job), "--job-name", "daemon", *(["--no-wait"] if no_wait else []), env=env)
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: _record(home, "daemon").get("TrainingEndTime"), timeout=60)
    daemon = int(pid_file.read_text())
    assert wait_for(lambda: not Path(f"/proc/{daemon}").exists(), timeout=10)
    assert _record(home, "daemon")["TrainingJobStatus"] == "Completed"
    assert f"pid {daemon} " in (home / "jobs" / "daemon" / "logs" / "job.log").read_text()  # said what it ended
