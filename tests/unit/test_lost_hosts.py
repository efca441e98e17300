"""A lost host (its processes killed, no failure report) as the supervisor sees it through each
runner's host process (launcher.local.restarts), and where the Slurm runner starts it again
(launcher.slurm.runner: a spare node of the allocation, else its own node, else no restart).
The restarts themselves run on a real Slurm in tests/e2e/test_slurm_restarts.py."""

from __future__ import annotations

import signal

import pytest

from launcher.local import restarts
from launcher.local.spec import LocalJobSpec, RunnerError
from launcher.slurm import commands
from launcher.slurm.runner import SlurmRunner
from launcher.wire import faults
from launcher.wire.metric_lines import Progress, write_progress


def spec(tmp_path, hosts=("algo-1", "algo-2")) -> LocalJobSpec:
    return LocalJobSpec(name="j", job_dir=tmp_path, hosts=list(hosts), instance_type="local", processes_per_host=1,
                        hyperparameters={}, channels={}, environment={}, checkpoint_dir=tmp_path / "ck",
                        max_run=60, max_restarts=2)


@pytest.mark.parametrize(("code", "signum"), [
    (-9, signal.SIGKILL),  # the process runner's bootstrap, a child of the supervisor
    (137, signal.SIGKILL),  # srun's or `podman start --attach`'s report of their task killed
    (143, signal.SIGTERM),
    (1, None), (2, None), (125, None), (127, None), (128, None),  # errors, the wrappers' own included
])
def test_a_signal_is_read_from_the_host_process_or_its_wrapper(code, signum):
    assert restarts.killed_by(code) == signum


def test_a_host_killed_without_a_report_is_lost_and_one_with_a_report_is_not(tmp_path):
    job = spec(tmp_path)
    assert restarts.lost_host(job, [("algo-1", 0), ("algo-2", 137)]) == ("algo-2", 137)
    assert "algo-2 was killed by SIGKILL without a failure report" in restarts.record_loss(
        job, "algo-2", 137, attempt=0, restarted=True).reason
    assert restarts.lost_host(job, [("algo-2", 1)]) is None  # an error: its bootstrap's to classify
    report = tmp_path / "hosts" / "algo-2" / "output" / "failure"
    report.parent.mkdir(parents=True, exist_ok=True)  # record_loss wrote output/data under it
    report.write_text("ExecuteUserScriptError")
    assert restarts.lost_host(job, [("algo-2", 137)]) is None  # its bootstrap saw it and reported


def test_a_host_lost_where_it_was_lost_the_attempt_before_is_not_restarted(tmp_path):
    """The repeat rule of every failure (launcher.wire.faults.repeats) for a lost host: the same host,
    rank 0 having logged no step beyond the loss before. Controls: a step beyond it, or another host."""
    job = spec(tmp_path)  # max_restarts 2
    rank0 = tmp_path / "hosts" / "algo-1" / "output" / "data"
    write_progress(rank0, Progress(step=4, max_steps=10))
    assert restarts.judge_loss(job, "algo-2", 0) == (faults.FAULT, None)  # the first loss
    restarts.record_loss(job, "algo-2", 137, attempt=0, restarted=True)
    assert restarts.judge_loss(job, "algo-2", 1) == (
        faults.REPEATED, "not restarted (repeated: the same failure as the attempt before, with no step "
                         "completed beyond it)")
    assert restarts.judge_loss(job, "algo-1", 1) == (faults.FAULT, None)  # another host
    write_progress(rank0, Progress(step=5, max_steps=10))
    assert restarts.judge_loss(job, "algo-2", 1) == (faults.FAULT, None)  # a step beyond it
    assert restarts.judge_loss(job, "algo-2", 2) == (faults.FAULT, "not restarted: all 2 restarts (max_restarts) used")
    # the FailureReason names every earlier failure, as the bootstrap's report does
    assert restarts.earlier_failures(job, 1, "not restarted (repeated: ...)") == (
        "; not restarted (repeated: ...); earlier failures: attempt 0 failed at step 4 (fault, restarted): "
        "algo-2 was killed by SIGKILL without a failure report: the host's processes are gone")


@pytest.fixture
def allocation(monkeypatch):
    """The job's allocation as scontrol would give it: n1..n3 at the start; `held` now."""
    held = ["n1", "n2", "n3"]
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr(commands, "hostnames", lambda nodelist: {"n[1-3]": ["n1", "n2", "n3"]}[nodelist])
    monkeypatch.setattr(commands, "job_nodes", lambda job_id: list(held))
    return held


def test_a_lost_host_moves_to_a_spare_node_then_stays_on_its_own(tmp_path, allocation):
    job, runner = spec(tmp_path), SlurmRunner()
    assert [runner.srun_command(job, h)[3] for h in job.hosts] == ["--nodelist=n1", "--nodelist=n2"]
    assert runner.host_lost(job, "algo-2") == "algo-2 moves from node n2 to spare node n3"
    assert runner.srun_command(job, "algo-2")[3] == "--nodelist=n3"
    assert runner.srun_command(job, "algo-1")[3] == "--nodelist=n1"  # the others stay where they ran
    # no spare left (n2 was lost on): the host starts again on its node, which the allocation still holds
    assert runner.host_lost(job, "algo-1") == "no spare node is left (slurm.spare_nodes): algo-1 runs on node n1 again"
    assert runner.srun_command(job, "algo-1")[3] == "--nodelist=n1"


def test_a_host_whose_node_left_the_allocation_is_not_restarted_without_a_spare(tmp_path, allocation):
    job, runner = spec(tmp_path, hosts=("algo-1", "algo-2", "algo-3")), SlurmRunner()
    runner.srun_command(job, "algo-1")  # placed: n1, n2, n3, no spare
    allocation.remove("n3")  # failed under --no-kill: Slurm took it out of the job
    with pytest.raises(RunnerError, match="node n3 of algo-3 has left the allocation and no spare node is left"):
        runner.host_lost(job, "algo-3")


def test_a_host_lost_in_an_attempt_the_bootstraps_restarted_into_counts_from_that_attempt(tmp_path):
    """Attempt 0 failed and the bootstraps restarted into attempt 1; a host lost there makes attempt 2
    (else the new hosts would run as attempt 1 again). Control: while attempt 1 had not begun
    training (its ranks never started), the supervisor's restart takes its number."""
    from launcher.wire import faults

    job = spec(tmp_path)
    data = tmp_path / "hosts" / "algo-1" / "output" / "data"
    faults.append_restart(data, faults.Restart(attempt=0, at="2026-01-01T00:00:00+00:00", failure_class=faults.FAULT,
                                               reason="rank 1 was killed by SIGKILL", host="algo-1", restarted=True))
    faults.append_attempt_start(data, faults.AttemptStart(attempt=0, start_step=0, at="2026-01-01T00:00:00+00:00"))
    assert restarts.next_attempt(job) == 1  # the control
    faults.append_attempt_start(data, faults.AttemptStart(attempt=1, start_step=2, at="2026-01-01T00:00:09+00:00"))
    assert restarts.next_attempt(job) == 2


def test_a_step_that_srun_ended_0_on_a_node_gone_from_the_allocation_is_a_killed_one(tmp_path, allocation):
    """srun may exit 0 after "Node failure on n2" although the task never finished (measured)."""
    job, runner = spec(tmp_path), SlurmRunner()
    runner.srun_command(job, "algo-1")  # placed: algo-1 on n1, algo-2 on n2
    assert runner.exit_code(job, "algo-2", 0) == 0  # n2 still held: a host that ended (its report decides)
    allocation.remove("n2")
    assert runner.exit_code(job, "algo-2", 0) == 128 + signal.SIGKILL
    assert runner.exit_code(job, "algo-2", 1) == 1  # an error is its bootstrap's to report
    success = tmp_path / "hosts" / "algo-2" / "output" / "success"
    success.parent.mkdir(parents=True)
    success.write_text("")
    assert runner.exit_code(job, "algo-2", 0) == 0  # it finished before the node went


def test_the_job_lists_the_record_that_names_the_cause_of_each_attempt(tmp_path):
    """Every host records an attempt's failure; the cause outranks its victims: a frozen rank its
    peers' hang, the host whose hang diagnosis found the rank outside the collective the host whose
    ranks only waited, a crash a peer's broken collective."""
    from launcher.local.restarts import job_restarts
    from launcher.wire import faults

    one, two = (tmp_path / h for h in ("algo-1", "algo-2"))

    def record(attempt, host, detail, diagnosis=None):
        return faults.Restart(attempt=attempt, at="2026-01-01T00:00:00+00:00", failure_class=faults.FAULT,
                              reason=f"{detail} on {host}", host=host, restarted=True, detail=detail,
                              extra={"diagnosis": diagnosis} if diagnosis else {})

    for directory, records in ((one, [record(0, "algo-1", "collective"), record(1, "algo-1", "hung",
                                      "every rank with stacks (0) waited in a collective: ..."),
                                      record(2, "algo-1", "hung")]),
                               (two, [record(0, "algo-2", "SIGKILL"), record(1, "algo-2", "hung",
                                      "no rank waited in a collective: rank 1 (host algo-2) in at_step"),
                                      record(2, "algo-2", "frozen")])):
        for r in records:
            faults.append_restart(directory, r)
    assert [(r.attempt, r.host) for r in job_restarts([one, two])] == [(0, "algo-2"), (1, "algo-2"), (2, "algo-2")]
    # control: read in the other order, the same records are chosen
    assert [(r.attempt, r.host) for r in job_restarts([two, one])] == [(0, "algo-2"), (1, "algo-2"), (2, "algo-2")]
