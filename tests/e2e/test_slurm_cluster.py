"""The local two-node Slurm cluster (tests/support/slurm_cluster.py) works, proven with plain sbatch/srun.

What this setup shows (slurm-wlm 22.05.8, Debian 12; each test below proves its part):

- Nodes: SLURM_JOB_NODELIST is `n[1-2]`; `scontrol show hostnames "$SLURM_JOB_NODELIST"` prints
  `n1` and `n2`, one per line; in each task SLURMD_NODENAME is `n1` or `n2`, SLURM_NODEID 0 or 1,
  SLURM_PROCID 0 or 1 (block distribution: node 0 is n1). The node names do not resolve (getent
  hosts n1 fails, `hostname` prints this machine's name on both): take a node's address from
  `scontrol show node n1 -o`, whose NodeAddr= is 127.0.0.1.
- Environment: sbatch exports the submitter's environment (--export=ALL) and srun's tasks inherit
  the batch script's, so a variable set for sbatch reaches every task.
- Exit: a batch script exiting 3 ends FAILED, `ExitCode=3:0` (exit status:signal) in `scontrol
  show job -o`. Only the batch script's status counts: a script whose srun's tasks fail but which
  then exits 0 ends COMPLETED, so a script must pass srun's status on (`exec srun ...`).
- Signals: `scancel --signal=TERM <job>` (no --batch, no --full) sends SIGTERM to every process of
  the job's srun steps (proctrack/linuxproc: the tasks and their children) and not to the batch
  script or srun; the job stays RUNNING, srun returns once the tasks exit, the script goes on.
  `--full` also signals the batch script and srun, and srun on SIGTERM kills its tasks with
  SIGKILL (their handlers never run); `--batch` signals only the script and srun (same result).
  A plain `scancel <job>` sends SIGTERM to all steps, the batch script included, then SIGKILL
  after KillWait (5 s here); the job ends CANCELLED. So: TERM with `scancel --signal=TERM <job>`,
  later `scancel <job>`.
- Queue: `squeue -h -j ID -o %T` prints PENDING/RUNNING while the job is queued or runs, and
  nothing (exit 0) once it ended; with `-t all` it prints the final state (COMPLETED, FAILED,
  CANCELLED) until MinJobAge (an hour here) purges the job, then fails with "slurm_load_jobs
  error: Invalid job id specified" (exit 1). `scontrol show job -o ID` behaves the same.
- Accounting is off: `sacct` fails, "Slurm accounting storage is disabled" (exit 1).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.slurm_cluster import ClusterUnavailable, SlurmCluster, check_can_run

pytestmark = pytest.mark.timeout(120)


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def wait_for(paths: list[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        missing = [path.name for path in paths if not path.exists()]
        assert time.monotonic() < deadline, f"no {missing} after {timeout} s"
        time.sleep(0.1)


@pytest.fixture
def out(slurm_cluster, request) -> Path:
    """A directory of the test's own that the job on both nodes writes to."""
    path = slurm_cluster.shared_dir / request.node.name
    path.mkdir()
    return path


def test_a_job_runs_one_task_on_each_node_with_the_submitters_environment(slurm_cluster, out):
    script = write_script(out / "job.sh", """
echo "$SLURM_JOB_NODELIST" > "$OUT/nodelist"
scontrol show hostnames "$SLURM_JOB_NODELIST" > "$OUT/hostnames"
exec srun bash -c 'echo "$SLURMD_NODENAME $SLURM_NODEID $SLURM_PROCID $PROBE" > "$OUT/task.$SLURM_PROCID"'
""")
    job = slurm_cluster.sbatch(script, "--nodes=2", "--ntasks-per-node=1",
                               f"--output={out}/slurm.out",
                               env={"OUT": str(out), "PROBE": "from-the-submitter"})

    assert slurm_cluster.wait_ended(job) == "COMPLETED", (out / "slurm.out").read_text()
    assert (out / "nodelist").read_text() == "n[1-2]\n"
    assert (out / "hostnames").read_text() == "n1\nn2\n"
    tasks = sorted(path.read_text() for path in out.glob("task.*"))
    assert tasks == ["n1 0 0 from-the-submitter\n", "n2 1 1 from-the-submitter\n"]


def test_jobs_of_two_tasks_per_node_share_the_nodes(slurm_cluster, out):
    # Each job ends well only if the other runs at the same time.
    script = write_script(out / "job.sh", """
srun bash -c 'touch "$OUT/started.$SLURM_JOB_ID.$SLURM_PROCID"'
for _ in $(seq 200); do [ $(ls "$OUT" | grep -c started) = 8 ] && exit 0; sleep 0.1; done
exit 1
""")
    jobs = [slurm_cluster.sbatch(script, "--nodes=2", "--ntasks-per-node=2", "--output=/dev/null",
                                 env={"OUT": str(out)}) for _ in range(2)]

    assert [slurm_cluster.wait_ended(job) for job in jobs] == ["COMPLETED", "COMPLETED"]


def test_a_job_that_can_never_run_is_refused_at_submission(slurm_cluster, out):
    script = write_script(out / "job.sh", "true\n")
    for options, error in ((["--nodes=2", "--ntasks-per-node=3"], "More processors requested"),
                           (["--nodes=3"], "Node count specification invalid")):
        result = slurm_cluster.run("sbatch", *options, str(script), check=False)
        assert result.returncode == 1 and error in result.stderr, (options, result.stderr)


def test_each_node_has_the_loopback_address(slurm_cluster):
    for node in ("n1", "n2"):
        fields = slurm_cluster.run("scontrol", "show", "node", node, "-o").stdout.split()
        assert "NodeAddr=127.0.0.1" in fields, fields


def test_a_failing_job_ends_failed_with_its_exit_code(slurm_cluster, out):
    job = slurm_cluster.sbatch(write_script(out / "job.sh", "exit 3\n"), "--output=/dev/null")

    assert slurm_cluster.wait_ended(job) == "FAILED"
    fields = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout.split()
    assert {"JobState=FAILED", "ExitCode=3:0"} <= set(fields), fields
    # Without --states=all, squeue no longer lists an ended job.
    assert slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout == ""


def test_sacct_says_accounting_is_off(slurm_cluster):
    result = slurm_cluster.run("sacct", "-j", "1", check=False)
    assert result.returncode == 1
    assert "Slurm accounting storage is disabled" in result.stderr


def test_term_reaches_the_tasks_first_and_a_plain_scancel_ends_the_job(slurm_cluster, out):
    task = write_script(out / "task.sh", """
trap 'echo TERM > "$OUT/task.$SLURM_PROCID.term"; exit 0' TERM
touch "$OUT/ready.$SLURM_PROCID"
while :; do sleep 0.1; done
""")
    script = write_script(out / "job.sh", f"""
trap 'echo TERM > "$OUT/batch.term"' TERM
srun {task}
echo $? > "$OUT/srun.exit"
sleep 300
""")
    job = slurm_cluster.sbatch(script, "--nodes=2", "--ntasks-per-node=1",
                               f"--output={out}/slurm.out", env={"OUT": str(out)})
    wait_for([out / "ready.0", out / "ready.1"])

    slurm_cluster.run("scancel", "--signal=TERM", job)
    wait_for([out / "srun.exit"])
    assert (out / "task.0.term").exists() and (out / "task.1.term").exists()
    assert (out / "srun.exit").read_text() == "0\n"  # the tasks' handlers ran and exited 0
    assert not (out / "batch.term").exists()  # the batch script was not signalled
    assert slurm_cluster.state(job) == "RUNNING"

    slurm_cluster.run("scancel", job)
    assert slurm_cluster.wait_ended(job) == "CANCELLED"
    assert (out / "batch.term").exists()  # SIGTERM before the SIGKILL, this time to the script


def pids_matching(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return found.stdout.split()


def alive(pid: str) -> bool:
    """Running, not a zombie (a container's init may never reap the step daemons)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def can_run():
    try:
        check_can_run()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))


def test_stopping_leaves_no_daemon_step_daemon_or_task(can_run, tmp_path, short_tmp_path):
    token = f"slurm-task-{os.getpid()}-{time.monotonic_ns()}"  # names this test's tasks only
    with SlurmCluster(short_tmp_path / "c") as cluster:
        script = write_script(tmp_path / "job.sh", f"exec srun bash -c 'exec -a {token} sleep 300'\n")
        job = cluster.sbatch(script, "--nodes=2", "--output=/dev/null")
        cluster.wait_state(job, {"RUNNING"})
        deadline = time.monotonic() + 30
        while len(tasks := pids_matching(token)) < 2:
            assert time.monotonic() < deadline, f"tasks {tasks} after 30 s"
            time.sleep(0.1)
        step_daemons = [Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                        for pid in tasks]
        daemons = pids_matching(str(cluster.root))
        assert len(daemons) >= 4, daemons  # munged, slurmctld, slurmd n1 and n2 at least

    assert pids_matching(str(cluster.root)) == []
    assert pids_matching(token) == []
    assert [pid for pid in [*tasks, *step_daemons, *daemons] if alive(pid)] == []


def test_a_daemon_that_cannot_start_is_reported_with_its_log(can_run, tmp_path, short_tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    write_script(fake / "slurmd", 'echo "slurmd: fatal: cannot start for this test" >&2\nexit 1\n')
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    cluster = SlurmCluster(short_tmp_path / "c")

    with pytest.raises(ClusterUnavailable) as failure:
        cluster.start()

    assert "exited with 1 while starting" in str(failure.value)
    assert "slurmd: fatal: cannot start for this test" in str(failure.value)
    assert pids_matching(str(cluster.root)) == []  # munged and slurmctld were stopped


def test_missing_binaries_are_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(ClusterUnavailable) as failure:
        check_can_run()

    assert all(name in str(failure.value) for name in ("slurmctld", "slurmd", "sbatch", "munged"))
    assert "scripts/install-slurm.sh" in str(failure.value)
