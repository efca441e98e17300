"""Goodput measured (launcher/wire/goodput.py): hand-built metrics and restart records with known
times give known shares; the time ledger's fields (container/resilience/ledger.py,
launcher/wire/metric_lines.py). A real run's records are checked in tests/integration/test_goodput_ledger.py."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from container.resilience.ledger import DATA, TimeLedger
from launcher.wire import goodput as gw
from launcher.wire import metric_lines as fields
from launcher.wire.faults import FAULT, Restart, append_restart

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(attempt: int, start_step: int, loop_start: float, step: int, steps: float, data: float = 0.0,
           checkpoint: float = 0.0, validation: float = 0.0) -> dict:
    """A metrics record as rank 0 writes it, with the loss fields a record has besides."""
    return {"step": step, "loss": 2.5, "tokens_per_s": 100.0,
            **fields.ledger_fields(attempt, start_step, at(loop_start), {fields.STEPS: steps, fields.DATA: data,
                                                                     fields.CHECKPOINT: checkpoint,
                                                                     fields.VALIDATION: validation})}


def failure(attempt: int, when: float, step: int, resumed_from: int = 0, host: str = "algo-1") -> Restart:
    return Restart(attempt=attempt, at=at(when).isoformat(), failure_class=FAULT, reason="rank 1 exited",
                   host=host, restarted=True, rank=1, step=step, resumed_from=resumed_from, seconds=None)


# A 200 s job, one failure. Attempt 0: loop from 10 s, 1 s per step, logged at step 20 (20 s of steps,
# 2 s of batches, 4 s of saves); it fails at 50 s having completed step 25. Attempt 1 resumes the
# checkpoint of step 20 at 70 s and logs step 100 (80 s of steps, 8 s batches, 16 s saves, 4 s
# validation). So: productive 20 + 80 = 100 s; replayed steps 21..25 = 5 s; start-up 10 s; restarts
# 20 s (50 -> 70) and 9 s of attempt 0's loop its ledger does not explain (40 s, of which 25 steps,
# 2 s batches and 4 s saves); checkpoints 20, input waits 10, validation 4; other 200 - 178 = 22 s.
RECORDS = [record(0, 0, 10, 10, 10.0, 1.0, 0.0), record(0, 0, 10, 20, 20.0, 2.0, 4.0),
           record(1, 20, 70, 60, 40.0, 4.0, 8.0, 2.0), record(1, 20, 70, 100, 80.0, 8.0, 16.0, 4.0)]


def test_a_job_with_one_restart_splits_its_wall_time_as_computed_by_hand():
    g = gw.goodput(T0, at(200), [failure(0, 50, 25)], RECORDS)
    assert g.wall_s == pytest.approx(200.0, abs=1e-9)
    assert g.productive_s == pytest.approx(100.0, abs=1e-9)
    expected = {"start-up": 10, "restarts": 29, "replayed": 5, "checkpoints": 20, "input waits": 10,
                "validation": 4, "other": 22}
    assert g.lost_s == pytest.approx(expected, abs=1e-9)
    assert g.fraction == pytest.approx(0.5, abs=1e-12)
    shares = ", ".join(f"{name} {seconds / 200:.0%}" for name, seconds in expected.items())
    assert g.text() == f"goodput 50% ({shares})"
    assert g.productive_s + sum(g.lost_s.values()) == pytest.approx(g.wall_s, abs=1e-9)


def test_control_the_same_run_without_a_failure():
    g = gw.goodput(T0, at(130), [], [record(0, 0, 10, 100, 100.0, 10.0, 5.0)])
    assert g.productive_s == pytest.approx(100.0, abs=1e-9)
    assert g.lost_s == pytest.approx({"start-up": 10, "restarts": 0, "replayed": 0, "checkpoints": 5,
                                      "input waits": 10, "validation": 0, "other": 5}, abs=1e-9)
    assert g.text() == "goodput 77% (start-up 8%, checkpoints 4%, input waits 8%, other 4%)"


def test_a_restart_that_resumes_the_step_it_failed_after_replays_nothing():
    records = [record(0, 0, 0, 20, 20.0), record(1, 20, 30, 40, 20.0)]
    g = gw.goodput(T0, at(50), [failure(0, 25, 20)], records)
    assert g.lost_s["replayed"] == 0 and g.productive_s == pytest.approx(40.0, abs=1e-9)
    # attempt 0's loop ran 25 s for 20 s of steps: 5 s lost to the failure, then 5 s to the restart
    assert g.lost_s["restarts"] == pytest.approx(10.0, abs=1e-9)


def test_a_failure_before_any_logged_step_counts_in_start_up_and_hosts_reports_are_merged(tmp_path):
    hosts = [tmp_path / "algo-1", tmp_path / "algo-2"]
    for host in hosts:
        host.mkdir()
    (hosts[0] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + '{"step": 1, "lo')
    append_restart(hosts[0], failure(0, 50, 25))
    append_restart(hosts[1], failure(0, 51, 25, host="algo-2"))  # the same failure, seen a second later
    g = gw.measure(hosts, T0, at(200))
    assert g.lost_s["restarts"] == pytest.approx(29.0, abs=1e-9)  # the earliest report counts
    # control: attempt 0 left no ledger (it failed before logging a step): all before attempt 1's loop is start-up
    g = gw.goodput(T0, at(200), [failure(0, 50, 3)], RECORDS[2:])
    assert g.lost_s["start-up"] == pytest.approx(70.0, abs=1e-9) and g.lost_s["restarts"] == 0


def test_without_ledger_records_there_is_nothing_to_measure(tmp_path):
    assert gw.measure([tmp_path], T0, at(10)) is None
    assert gw.goodput(T0, at(10), [], [{"step": 3, "loss": 1.0}, {"step": 3, "val_loss": 1.0}]) is None


def test_the_ledger_counts_a_steps_batches_apart_from_its_work(monkeypatch):
    clock = iter([0.0, 0.25, 10.0, 10.5])  # two timings: 0.25 s and 0.5 s of batches
    monkeypatch.setattr("container.resilience.ledger.time.perf_counter", lambda: next(clock))
    monkeypatch.setenv("SMLAUNCH_ATTEMPT", "2")
    ledger = TimeLedger(start_step=40)
    with ledger.timing(DATA):
        pass
    ledger.step(1.25)  # the step took 1.25 s with its 0.25 s of batches
    with ledger.timing(DATA):
        pass
    ledger.step(0.75)
    fields = ledger.fields()
    assert fields["time_steps_s"] == pytest.approx(1.25, abs=1e-9) and fields["time_data_s"] == pytest.approx(0.75)
    assert fields["attempt"] == 2 and fields["start_step"] == 40
    assert fields["time_checkpoint_s"] == 0 and fields["time_validation_s"] == 0
    assert datetime.fromisoformat(fields["loop_start"]).tzinfo is not None


def _local_job(root, supervisor_restarts: list[Restart], host_restarts: list[Restart]) -> None:
    """A 200 s local job of RECORDS (attempt 1 resumed step 20 at 70 s) as `status` finds it."""
    job = root / "lost"
    data = job / "hosts" / "algo-1" / "output" / "data"
    data.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"TrainingJobName": "lost", "TrainingJobStatus": "Completed",
                                              "TrainingStartTime": T0.isoformat(),
                                              "TrainingEndTime": at(200).isoformat()}))
    (data / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    for record in supervisor_restarts:  # as launcher.local.restarts.record_loss: into every host's
        for host in ("algo-1", "algo-2"):
            append_restart(job / "hosts" / host / "output" / "data", record)
    for record in host_restarts:
        append_restart(data, record)


def test_a_lost_hosts_restart_counts_in_restarts_where_the_supervisor_recorded_it(tmp_path):
    """A host lost at 50 s: its own bootstrap was killed, so only the supervisor's record (which it
    writes into every host's output data) knows the failure. Attempt 0's loop ran 10 -> 50 s for 26 s
    its ledger explains (20 s of steps to step 20, its last logged, 2 s batches, 4 s saves), then
    50 -> 70 s down: 34 s."""
    from launcher.backends.local import LocalBackend
    from launcher.local.restarts import LOST

    lost = Restart(attempt=0, at=at(50).isoformat(), failure_class=FAULT, host="algo-2", restarted=True,
                   detail=LOST, reason="algo-2 was killed by SIGKILL without a failure report")
    _local_job(tmp_path / "supervisor", [lost], [])
    g = LocalBackend(root=tmp_path / "supervisor").goodput("lost")
    assert g.lost_s["restarts"] == pytest.approx(34.0, abs=1e-9)
    assert g.lost_s["other"] == pytest.approx(22.0, abs=1e-9)  # as in the bootstrap's case: the same 22 s
    # control: the same failure recorded by a host's bootstrap splits the same way
    _local_job(tmp_path / "bootstrap", [], [replace(lost, host="algo-1")])
    assert LocalBackend(root=tmp_path / "bootstrap").goodput("lost").lost_s == pytest.approx(g.lost_s, abs=1e-9)


def test_list_shows_each_jobs_goodput_beside_its_restarts(tmp_path):
    """Issue 49: `list` showed restarts but not goodput. The job of RECORDS with its one restart (50%, as
    computed by hand above) has both; a script of the user's own has no time ledger, so no goodput (the
    control), and a listing of such jobs alone has no goodput column."""
    import io

    from rich.console import Console

    from launcher.backends.local import LocalBackend
    from launcher.cli.jobview import jobs_table

    _local_job(tmp_path, [], [failure(0, 50, 25)])
    script = tmp_path / "script"
    (script / "hosts" / "algo-1" / "output" / "data").mkdir(parents=True)
    (script / "job.json").write_text(json.dumps({"TrainingJobName": "script", "TrainingJobStatus": "Completed",
                                                 "TrainingStartTime": T0.isoformat(),
                                                 "TrainingEndTime": at(10).isoformat()}))
    rows = {row["TrainingJobName"]: row for row in LocalBackend(root=tmp_path).list()}
    assert rows["lost"]["Goodput"] == 0.5 and rows["lost"]["Restarts"] == 1
    assert "Goodput" not in rows["script"] and "Restarts" not in rows["script"]

    def table(jobs: list[dict], name: str = "") -> list[str]:
        out = Console(file=io.StringIO(), width=80, color_system=None)
        out.print(jobs_table([{**j, "Handle": f"local:{name or j['TrainingJobName']}"} for j in jobs], 80))
        return out.file.getvalue().splitlines()

    lines = table([rows["lost"], rows["script"]])
    assert lines[0].split() == ["job", "status", "restarts", "goodput", "created", "duration"]
    assert lines[1].split()[:4] == ["local:lost", "Completed", "1", "50%"]
    assert "goodput" not in table([rows["script"]])[0]
    # a long handle: the columns give way (created, goodput, duration, restarts), none wraps past 80
    long = table([rows["lost"]], "smlaunch-demo-2026-11-28-22-32-05-154")
    assert long[0].split() == ["job", "status", "restarts", "duration"] and max(map(len, long)) <= 80
    assert table([rows["lost"]], "a" * 56)[0].split() == ["job", "status"]


def test_a_damaged_metrics_line_is_said_by_status_list_and_metrics_not_skipped(home):
    """One rule for metrics.jsonl (launcher.wire.metric_lines.parse_records): goodput skipped a
    damaged middle line, a record missing from its sums, while `smlaunch metrics` refused the file.
    Now goodput is not measured and `status` and `list` say why, listing the job all the same; the
    metrics command fails naming the line (exit 1, no traceback). The control: a cut last line is
    being written, and the goodput is measured."""
    from click.testing import CliRunner

    from launcher.backends.local import LocalBackend
    from launcher.cli.app import main
    from launcher.wire.metric_lines import DamagedMetrics

    jobs = home / "jobs"
    _local_job(jobs, [], [failure(0, 50, 25)])
    record = json.loads((jobs / "lost" / "job.json").read_text())
    (jobs / "lost" / "job.json").write_text(json.dumps({**record, "LocalJobDir": str(jobs / "lost")}))
    metrics = jobs / "lost" / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + '{"step": 101, "lo')
    assert LocalBackend(root=jobs).goodput("lost").fraction == 0.5
    metrics.write_text(whole.replace("\n", "\n{garbage\n", 1))
    with pytest.raises(DamagedMetrics, match="metrics.jsonl: line 2 is not a JSON object"):
        LocalBackend(root=jobs).goodput("lost")
    status = CliRunner().invoke(main, ["status", "local:lost"])
    assert status.exit_code == 0 and "goodput not measured: " in status.output and "line 2" in status.output
    listed = CliRunner().invoke(main, ["list", "--backend", "local"])
    assert listed.exit_code == 0 and "local:lost" in listed.output
    assert "lost: goodput not measured: " in listed.output
    shown = CliRunner().invoke(main, ["metrics", "local:lost"])
    assert shown.exit_code == 1 and "line 2 is not a JSON object" in shown.output and "Traceback" not in shown.output


# --- SageMaker: from what the job writes (launcher.backends.sagemaker_records) ----------------------------
def test_a_sagemaker_jobs_restarts_come_from_its_log_while_it_runs_and_its_goodput_from_its_output(
        fake_credentials, tmp_path):
    import boto3
    from moto import mock_aws

    from launcher.backends.sagemaker import SageMakerBackend
    from launcher.cli import jobview
    from launcher.wire.archives import pack
    from launcher.wire.faults import restart_line
    from tests.support.sagemaker_jobs import BUCKET, make_job, moto_job, put_logs, set_status

    lost = failure(0, 50, 25)
    with mock_aws():
        session = boto3.Session(region_name="us-east-1")
        session.client("s3").create_bucket(Bucket=BUCKET)
        backend = SageMakerBackend(session, printer=lambda _: None)
        name = backend.submit(make_job(max_restarts=2), job_name="sm-restarts")
        set_status(name, "InProgress")
        t = int(datetime.now(timezone.utc).timestamp() * 1000) - 60_000
        # both hosts' bootstraps log the attempt's record; algo-2's knows no step (its rank was killed)
        put_logs(session, name, 1, [(t, f"[smlaunch] {restart_line(lost)}"), (t + 1, "rank 0 line")])
        peer = restart_line(replace(lost, host="algo-2", step=None))
        put_logs(session, name, 2, [(t + 2, f"algo-2 | [smlaunch] {peer}"),
                                    (t + 3, "smlaunch-restart-record {not json")])
        assert backend.restarts(name) == [lost]  # one per attempt, the step its host knew
        assert backend.goodput(name) is None  # the ledger is in output.tar.gz, not there yet
        running = jobview.describe(backend, name)
        assert jobview.restart_lines(running)[0] == "restarts: 1 of 2 (max_restarts)"

        host = tmp_path / "algo-1"
        host.mkdir()
        (host / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
        append_restart(host, lost)
        archive = pack([host], tmp_path / "output.tar.gz")
        session.client("s3").upload_file(str(archive), BUCKET, f"output/{name}/output/output.tar.gz")
        set_status(name, "Completed")
        moto_job(name).training_start_time, moto_job(name).training_end_time = T0, at(200)
        ended = SageMakerBackend(session, printer=lambda _: None)
        assert ended.restarts(name) == [lost]
        assert ended.goodput(name).fraction == pytest.approx(0.5, abs=1e-12)  # by hand, above
        assert jobview.describe(ended, name)["Goodput"]["text"].startswith("goodput 50% (start-up 5%")
