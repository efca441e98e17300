"""Which failures are restarted (container/toolkit/restarts.py), the records the bootstrap and the
launcher share (launcher/wire/faults.py), the armed fault injection, and max_restarts in
validate, the estimator and ModelTrainer. The restarts themselves run in
tests/integration/test_restarts.py."""

from __future__ import annotations

import re
import time

import pytest

from container.toolkit.restarts import Failure, backoff_s, classify
from launcher.wire import control_env, faults
from launcher.wire.faults import FAULT, JOB_ERROR, REPEATED, Fault, RankFailure, Restart
from launcher.wire.restart_policy import REQUESTED, PolicyError, RestartPolicy, counted

KILLED = Failure("rank 1 (host algo-1, local rank 1) was killed by SIGKILL", 137, signal=True, rank=1)


def _record(rank=1, exception="RuntimeError", bases=("RuntimeError", "Exception"), step=7, start=4,
            collective=False) -> RankFailure:
    return RankFailure(rank, exception, "boom", step, start, collective, bases)


def _exited(rank=1, code=1, tail="") -> Failure:
    return Failure(f"rank {rank} (host algo-1, local rank {rank}) exited with code {code}", code, rank=rank,
                   stderr_tail=tail)


def _earlier(decision, failure: Failure) -> Restart:
    return Restart(attempt=0, at="2026-11-27T00:00:00+00:00", failure_class=decision.failure_class,
                   reason=failure.header, host="algo-1", restarted=True, rank=failure.rank, step=decision.step,
                   detail=decision.detail)


def test_a_killed_hung_or_frozen_rank_and_a_peers_failure_are_faults():
    assert classify(KILLED, {}, []).failure_class == FAULT
    hung = Failure("rank 0 ... exited with code 86", faults.EXIT_HUNG, rank=0)
    assert classify(hung, {}, []).detail == "hung"
    frozen = Failure("rank 1 ... did not report: stopped", 1, rank=0, frozen=True)
    assert classify(frozen, {}, []).failure_class == FAULT
    # a frozen rank, continued, may leave through its own watchdog: still the frozen one
    continued = Failure("rank 1 ... did not report: stopped ...; first failure: ... code 86", faults.EXIT_HUNG,
                        rank=1, frozen=True)
    assert classify(continued, {}, []).detail == "frozen"
    peers = {0: _record(0, collective=True), 1: _record(1, collective=True)}
    assert classify(_exited(0), peers, []).detail == "collective"
    assert classify(_exited(), {1: _record()}, []).failure_class == FAULT  # an error after progress


def test_errors_of_the_job_are_not_restarted():
    # a ValueError's subclass (PretrainedError) is a job error by its base, at any step
    value = _record(exception="PretrainedError", bases=("PretrainedError", "ValueError", "Exception"))
    decision = classify(_exited(), {1: value}, [])
    assert decision.failure_class == JOB_ERROR and decision.detail == "PretrainedError"
    # any error before the attempt's first step: a shape error at step 0 comes back on a restart
    before = _record(step=4, start=4)
    assert classify(_exited(), {1: before}, []).failure_class == JOB_ERROR
    # one rank's own error decides, even where its peers failed in the collective it left
    mixed = {0: _record(0, collective=True), 1: value}
    assert classify(_exited(0), mixed, []).failure_class == JOB_ERROR
    # a non-finite loss under nonfinite_policy=fail, an out-of-memory
    for name in ("FloatingPointError", "OutOfMemoryError"):
        rec = _record(exception=name, bases=(name, "Exception"))
        assert classify(_exited(), {1: rec}, []).failure_class == JOB_ERROR, name


def test_a_scripts_exception_is_read_from_its_traceback():
    tail = "Traceback (most recent call last):\n  File \"job.py\", line 3\nModuleNotFoundError: No module named 'x'\n"
    assert classify(_exited(tail=tail), {}, []).failure_class == JOB_ERROR
    other = "Traceback (most recent call last):\n  File \"job.py\", line 3\nRuntimeError: CUDA error\n"
    assert classify(_exited(tail=other), {}, []).failure_class == FAULT  # control: not a job error's kind


def test_a_fault_that_comes_back_without_progress_stops():
    first = classify(KILLED, {1: _record(step=7)}, [])
    earlier = [_earlier(first, KILLED)]
    again = classify(KILLED, {1: _record(step=7)}, earlier)
    assert again.failure_class == REPEATED
    # resumed from a checkpoint at that step, it fails again before completing one: that fault, back
    exited = _exited()
    first_exit = classify(exited, {1: _record(step=4, start=2)}, [])
    assert classify(exited, {1: _record(step=4, start=4)}, [_earlier(first_exit, exited)]).failure_class == REPEATED
    # control: the same fault after steps beyond the last is restarted again
    assert classify(KILLED, {1: _record(step=9)}, earlier).failure_class == FAULT
    # control: another rank's crash is another failure
    other = Failure("rank 0 (host algo-1, local rank 0) was killed by SIGKILL", 137, signal=True, rank=0)
    assert classify(other, {0: _record(0, step=7)}, earlier).failure_class == FAULT


def test_a_rollback_is_never_a_repeat():
    rollback = Failure("rank 0 ... exited with code 87", faults.EXIT_NONFINITE_ROLLBACK, rank=0)
    first = classify(rollback, {}, [])
    assert first.failure_class == FAULT
    assert classify(rollback, {}, [_earlier(first, rollback)]).failure_class == FAULT


def test_backoff_is_bounded():
    assert [backoff_s(n) for n in (1, 2, 3)] == [1, 2, 4]
    assert backoff_s(50) == 30


def test_fault_injection_is_armed_or_refused():
    assert faults.parse_faults(None) == [] and faults.parse_faults("") == []
    spec = faults.fault_spec(Fault("hang", 1, 5, attempt=0), Fault("exit", 0, 9))
    assert faults.parse_faults(spec) == [Fault("hang", 1, 5, 0), Fault("exit", 0, 9, None)]
    with pytest.raises(faults.FaultSpecError, match="must begin with"):
        faults.parse_faults("rank=1 step=5 fault=exit")  # no arming prefix: never a quiet no-op
    for bad in ("rank=1 step=5 fault=melt", "rank=x step=5 fault=exit", "rank=1 fault=exit", "rank=1 step=2 "
                "fault=exit color=red"):
        with pytest.raises(faults.FaultSpecError):
            faults.parse_faults(f"{faults.ARMING} {bad}")


def test_records_round_trip(tmp_path):
    record = Restart(attempt=1, at="2026-11-27T00:00:00+00:00", failure_class=FAULT, reason="r", host="algo-1",
                     restarted=True, rank=0, step=3, detail="SIGKILL")
    faults.append_restart(tmp_path, record)
    (tmp_path / faults.RESTARTS_FILE).open("a").write("not json\n")
    assert faults.read_restarts(tmp_path) == [record]
    assert faults.read_restarts(tmp_path / "none") == []


def _local(**fields) -> dict:
    return {"entry_point": "train.py", "source_dir": "entrypoints", "instance_type": "local",
            "hyperparameters": {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_steps": 4,
                                "checkpoint_freq": 2}, **fields}


def test_validate_says_that_smlaunchs_control_variables_in_the_shell_reach_no_job(monkeypatch):
    from launcher.config import validate_job
    from tests.support.train_runs import ROOT

    def shell_warnings():
        return [(w.path, w.value, w.fix) for w in validate_job(_local(), base_dir=ROOT).warnings if w.path[0] == "$"]

    monkeypatch.setenv("SMLAUNCH_HOME", str(ROOT))  # control: a setting of the client's own, which no job reads
    for name in control_env.CONTROL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert shell_warnings() == []
    monkeypatch.setenv(faults.MAX_RESTARTS_ENV, "1000000")
    monkeypatch.setenv(faults.FAULT_ENV, faults.fault_spec(Fault("exit", 0, 2)))
    assert [(path, fix) for path, _, fix in shell_warnings()] == [
        ("$SMLAUNCH_FAULT_INJECTION", "to arm fault injection for a test, set it in the job's environment "
                                      "(docs/faults.md)"),
        ("$SMLAUNCH_MAX_RESTARTS", "set max_restarts in the job file (docs/faults.md)")]


def test_every_smlaunch_variable_the_code_reads_is_a_control_variable_or_a_client_setting():
    """A variable of smlaunch's that control_env does not list would reach jobs from the caller's shell."""
    from tests.support.train_runs import ROOT

    named = {name for folder in ("container", "entrypoints", "launcher") for path in (ROOT / folder).rglob("*.py")
             for name in re.findall(r"[\"'](SMLAUNCH_[A-Z_]+)[\"']", path.read_text(encoding="utf-8"))}
    assert named - {"SMLAUNCH_HOME", "SMLAUNCH_CONTAINER_ENGINE"} == set(control_env.CONTROL_VARIABLES)


def test_validate_says_what_max_restarts_means_and_refuses_smlaunchs_own_variables():
    from launcher.config import validate_job
    from launcher.wire.training.issues import ConfigError
    from tests.support.train_runs import ROOT

    job = validate_job(_local(max_restarts=2), base_dir=ROOT)
    assert any(n.path == "max_restarts" and "restarts torchrun" in n.problem for n in job.notes)
    assert not any(n.path == "max_restarts" for n in validate_job(_local(), base_dir=ROOT).notes)  # control
    without = _local(max_restarts=1)
    without["hyperparameters"] = {k: v for k, v in without["hyperparameters"].items() if k != "checkpoint_freq"}
    assert any("starts training again from step 1" in w.problem for w in validate_job(without, base_dir=ROOT).warnings)
    armed = validate_job(_local(environment={faults.FAULT_ENV: faults.fault_spec(Fault("exit", 0, 2))}),
                         base_dir=ROOT)
    assert any("arms fault injection" in w.problem for w in armed.warnings)
    with pytest.raises(ConfigError) as err:
        validate_job(_local(environment={faults.ATTEMPT_ENV: "3"}), base_dir=ROOT)
    assert "environment.SMLAUNCH_ATTEMPT" in str(err.value) and "set max_restarts" in str(err.value)
    with pytest.raises(ConfigError):
        validate_job(_local(max_restarts=-1), base_dir=ROOT)


# --- the job's own rules (launcher.wire.restart_policy) -------------------------------------------
def test_an_exit_code_the_job_lists_is_restarted_without_counting():
    policy = RestartPolicy(0, (3, 75))
    decision = classify(_exited(code=75, tail="ValueError: the node is bad"), {}, [], policy)
    assert (decision.failure_class, decision.restart, decision.detail) == (REQUESTED, True, "exit code 75")
    # controls: a code it does not list, and a signal's code, are judged as before
    assert classify(_exited(code=4, tail="ValueError: x"), {}, [], policy).failure_class == JOB_ERROR
    assert classify(KILLED, {}, [], RestartPolicy(0, (137,))).failure_class == FAULT
    requested = _earlier(decision, _exited(code=75))  # attempt 0
    assert counted(1, [requested]) == 0 and counted(2, [requested]) == 1  # attempt 1 failed of a fault
    assert counted(1, []) == 1  # control: a restart without the job's rule counts


def test_job_errors_are_retried_as_often_as_the_job_asks_and_no_more():
    value = _record(exception="ValueError", bases=("ValueError", "Exception"), step=4, start=4)
    policy = RestartPolicy(3, (), 2)
    first = classify(_exited(), {1: value}, [], policy)
    assert (first.failure_class, first.restart) == (JOB_ERROR, True) and "restart_on_job_errors 2" in first.why
    earlier = [_earlier(first, _exited())]
    second = classify(_exited(), {1: value}, earlier, policy)  # the same error, no progress: still retried
    assert second.restart
    earlier.append(Restart(**{**earlier[0].__dict__, "attempt": 1}))
    assert not classify(_exited(), {1: value}, earlier, policy).restart  # two retried: the third is not
    assert not classify(_exited(), {1: value}, [], RestartPolicy(3)).restart  # control: the default, 0


def test_the_rules_reach_the_bootstrap_through_the_environment():
    policy = RestartPolicy(2, (3, 75), 1)
    assert RestartPolicy.from_environment(policy.environment()) == policy
    assert RestartPolicy().environment() == {} and RestartPolicy.from_environment({}) == RestartPolicy()
    with pytest.raises(PolicyError, match="SMLAUNCH_RESTART_ON_EXIT_CODES='3;4'"):
        RestartPolicy.from_environment({"SMLAUNCH_RESTART_ON_EXIT_CODES": "3;4"})


def test_validate_shows_the_rules_and_refuses_what_cannot_mean_what_it_says(tmp_path):
    from launcher.config import validate_job
    from launcher.wire.training.issues import ConfigError
    from tests.support.train_runs import ROOT

    (tmp_path / "fit.py").write_text("print('hi')\n")
    script = {"entry_point": "fit.py", "source_dir": str(tmp_path), "instance_type": "local"}
    job = validate_job({**script, "restart_on_exit_codes": [3], "max_restarts": 2, "restart_on_job_errors": 1})
    notes = {n.path: n.problem for n in job.notes}
    assert "restarted without counting against max_restarts" in notes["restart_on_exit_codes"]
    assert "retried this many times" in notes["restart_on_job_errors"]
    assert job.config.restart_policy.environment() == {
        "SMLAUNCH_MAX_RESTARTS": "2", "SMLAUNCH_RESTART_ON_EXIT_CODES": "3", "SMLAUNCH_RESTART_ON_JOB_ERRORS": "1"}
    refused = [({**script, "restart_on_exit_codes": [86]}, "smlaunch's exit code for a hung step"),
               ({**script, "restart_on_exit_codes": [137]}, "killed by signal 9"),
               ({**script, "restart_on_exit_codes": [0]}, "restart_on_exit_codes"),
               ({**script, "restart_on_job_errors": 2, "max_restarts": 1}, "set max_restarts to 2 or more"),
               (_local(restart_on_exit_codes=[3]), "smlaunch's train.py leaves with 1 on every error")]
    for data, message in refused:
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_job(data, base_dir=ROOT)


def test_a_script_is_hung_once_neither_its_cpu_time_nor_its_output_moves_for_the_timeout(monkeypatch, tmp_path):
    import threading

    from container.toolkit import script_watch

    monkeypatch.setattr(script_watch, "POLL_S", 0.01)
    monkeypatch.setattr(script_watch, "PROC", tmp_path)  # "Linux": the watch starts
    ticks = iter(range(10**6))
    busy = threading.Event()
    monkeypatch.setattr(script_watch, "cpu_ticks", lambda pid: next(ticks) if busy.is_set() else 7)
    monkeypatch.setattr(script_watch, "written", lambda log_dir: 0)
    hung = threading.Event()
    output = {"bytes": 0}

    def watch():
        return script_watch.ScriptWatch(1, 0.2, tmp_path, lambda: output["bytes"], lambda s: hung.set()).start()

    busy.set()  # control: a rank that computes is never hung
    computing = watch()
    assert not hung.wait(0.6)
    computing.stop()
    busy.clear()
    writing = watch()  # control: nor one that writes, without CPU
    for _ in range(30):
        output["bytes"] += 1
        time.sleep(0.02)
    assert not hung.is_set()
    assert hung.wait(2.0) and writing.hung_after >= 0.2  # silent since: hung


def test_validate_shows_hang_timeout_for_a_script_under_torchrun_and_refuses_it_elsewhere(tmp_path):
    from launcher.config import validate_job
    from launcher.wire.training.issues import ConfigError
    from tests.support.train_runs import ROOT

    (tmp_path / "fit.py").write_text("print('hi')\n")
    script = {"entry_point": "fit.py", "source_dir": str(tmp_path), "instance_type": "local", "hang_timeout": 60}
    job = validate_job({**script, "distribution": {"torch_distributed": {"enabled": True}}})
    assert any(n.path == "hang_timeout" and "write nothing for 60 s are hung" in n.problem for n in job.notes)
    assert job.config.restart_policy.environment() == {"SMLAUNCH_HANG_TIMEOUT": "60"}
    for data, message in [(script, "does not run under torchrun"),
                          (_local(hang_timeout=60), "smlaunch's train.py has a step watchdog"),
                          ({**script, "hang_timeout": 5}, "hang_timeout")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_job(data, base_dir=ROOT)
