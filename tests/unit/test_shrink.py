"""min_instance_count (docs/faults.md, "Shrink and go on"): the runtime's batch rule
(launcher.wire.training.shrink), what validate says and refuses (launcher.config.shrink_rules), and the
supervisor going on with the hosts left once a host cannot come back (launcher.local.shrink). The job
itself shrinks in tests/integration/test_shrink.py."""

from __future__ import annotations

import io
import json
import re

import pytest

from launcher.cli.jobview import restart_lines
from launcher.local import store
from launcher.local.process import ProcessRunner
from launcher.local.shrink import rank0_hosts
from launcher.local.spec import LocalJobSpec, attempt_environment
from launcher.local.supervise import Supervisor
from launcher.wire import faults
from launcher.wire.metric_lines import Progress, write_progress
from launcher.wire.opt_ml import host_names, master_host, write_opt_ml
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.shrink import ORIGINAL_WORLD_ENV, kept_accumulation, original_world, shrink_problems


# --- the runtime's rule -----------------------------------------------------------------------------
def test_the_lost_ranks_share_goes_to_gradient_accumulation():
    plain = ModelParallelParameters()
    assert shrink_problems(plain, 2, 1) == [] and kept_accumulation(3, plain, 2, 1) == 6
    assert kept_accumulation(1, plain, 8, 4) == 2
    # the data-parallel degrees, not the worlds: 8 ranks of tensor degree 2 (dp 4) to 4 ranks (dp 2)
    tp2 = ModelParallelParameters(tensor_parallel_degree=2)
    assert shrink_problems(tp2, 8, 4) == [] and kept_accumulation(1, tp2, 8, 4) == 2


def test_a_shrink_that_cannot_keep_the_batch_or_the_layout_is_refused_naming_why():
    uneven = shrink_problems(ModelParallelParameters(), 4, 3)
    assert [(p.key, p.value) for p in uneven] == [("gradient_accumulation_steps", 4)]
    assert "the job shrank from 4 to 3 ranks" in uneven[0].problem and "4 / 3 is no whole number" in uneven[0].problem
    tp = shrink_problems(ModelParallelParameters(tensor_parallel_degree=2), 2, 1)
    assert [p.key for p in tp] == ["tensor_parallel_degree"] and "shrank from 2 to 1 ranks" in tp[0].problem


def test_the_original_world_is_read_only_where_the_supervisor_set_it():
    assert original_world({}) is None
    assert original_world({ORIGINAL_WORLD_ENV: "4"}) == 4
    with pytest.raises(ValueError, match="SMLAUNCH_ORIGINAL_WORLD='x'"):
        original_world({ORIGINAL_WORLD_ENV: "x"})


# --- validate ---------------------------------------------------------------------------------------
def _job(**fields) -> dict:
    return {"entry_point": "train.py", "source_dir": "entrypoints", "instance_type": "local", "instance_count": 2,
            "hyperparameters": {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_steps": 4,
                                "checkpoint_freq": 2}, **fields}


def test_validate_shows_what_min_instance_count_does():
    from launcher.config import validate_job
    from tests.support.train_runs import ROOT

    job = validate_job(_job(min_instance_count=1, max_restarts=1), base_dir=ROOT)
    notes = [n.problem for n in job.notes if n.path == "min_instance_count"]
    assert len(notes) == 1 and "restarts on the hosts left, down to 1 of 2" in notes[0]
    assert "keeps the global batch" in notes[0] and "host-gone" in notes[0]
    control = validate_job(_job(max_restarts=1), base_dir=ROOT)
    assert not any(n.path == "min_instance_count" for n in control.notes)


def test_the_estimator_takes_min_instance_count_as_a_job_field():
    from launcher.sdk.estimator import PyTorch
    from tests.support.train_runs import ROOT

    fields = _job(min_instance_count=1, max_restarts=1)
    fields["source_dir"] = str(ROOT / fields["source_dir"])
    assert PyTorch(**fields).config.min_instance_count == 1


@pytest.mark.parametrize(("fields", "message"), [
    ({"min_instance_count": 3, "max_restarts": 1}, "exceeds instance_count 2"),
    ({"min_instance_count": 1}, "max_restarts is 0"),
    ({"min_instance_count": 1, "max_restarts": 1, "inputs": {"train": {
        "s3_data": "s3://bucket/train", "distribution": "ShardedByS3Key"}}}, "channel train is ShardedByS3Key"),
    ({"min_instance_count": 0, "max_restarts": 1}, "min_instance_count"),
    ({"min_instance_count": 1, "max_restarts": 1, "backend": "kubernetes", "instance_type": "ml.g5.xlarge"},
     "refused on backend kubernetes: not yet on Kubernetes"),
    ({"min_instance_count": 1, "max_restarts": 1, "instance_type": "ml.g5.xlarge"},
     "refused on backend sagemaker: a SageMaker training job's instance count is fixed"),
    # smlaunch's runtime could not lay tensor degree 2 out on the one host left
    ({"min_instance_count": 1, "max_restarts": 1, "processes_per_host": 2,
      "distribution": {"torch_distributed": {"enabled": True},
                       "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                           "tensor_parallel_degree": 4}}}}},
     "at 1 host(s) smlaunch's runtime could not go on: tensor_parallel_degree 4"),
])
def test_validate_refuses_a_min_instance_count_that_cannot_mean_what_it_says(fields, message):
    from launcher.config import validate_job
    from launcher.wire.training.issues import ConfigError
    from tests.support.train_runs import ROOT

    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        validate_job(_job(**fields), base_dir=ROOT)
    assert any(i.path == "min_instance_count" for i in err.value.issues)


# --- the supervisor -----------------------------------------------------------------------------------
def _spec(tmp_path, least: int, hosts=("algo-1", "algo-2")) -> LocalJobSpec:
    spec = LocalJobSpec(name="j", job_dir=tmp_path, hosts=list(hosts), instance_type="local", processes_per_host=2,
                        hyperparameters={}, channels={}, environment={}, checkpoint_dir=tmp_path / "ck",
                        max_run=60, max_restarts=2, min_instance_count=least)
    for host in hosts:
        write_opt_ml(spec.host_dir(host), hyperparameters={}, current_host=host, hosts=list(hosts),
                     instance_type="local", channels={})
    store.write(tmp_path, {"TrainingJobName": "j", "TrainingJobStatus": "InProgress"})
    return spec


def _after_loss(spec: LocalJobSpec, gone: bool) -> tuple[bool, Supervisor]:
    """The supervisor's decision once algo-2 was killed (and, `gone`, cannot come back)."""
    if gone:
        (spec.host_dir("algo-2") / faults.HOST_GONE).touch()
    supervisor = Supervisor(spec, runner=ProcessRunner(), printer=None)
    supervisor._merged = io.BytesIO()
    return supervisor._restart_after_loss("host_failed", [("algo-2", -9), ("algo-1", -15)]), supervisor


def _hosts(spec: LocalJobSpec, host: str) -> list[str]:
    config = json.loads((spec.host_dir(host) / "input" / "config" / "resourceconfig.json").read_text())
    assert config["instance_groups"][0]["hosts"] == config["hosts"]
    return config["hosts"]


def test_a_host_that_cannot_come_back_leaves_the_job_on_the_hosts_left(tmp_path):
    spec = _spec(tmp_path, least=1)
    restarted, _ = _after_loss(spec, gone=True)
    assert restarted and spec.hosts == ["algo-1"] and spec.attempt == 1
    assert _hosts(spec, "algo-1") == ["algo-1"]
    assert LocalJobSpec.load(tmp_path).hosts == ["algo-1"]  # a detached supervisor's spec too
    assert spec.every_host() == ["algo-1", "algo-2"]  # whose output data and scratch the job's end still takes
    assert attempt_environment(spec) == {faults.ATTEMPT_ENV: "1", ORIGINAL_WORLD_ENV: "4"}  # 2 hosts x 2
    assert store.merged(tmp_path)["Shrinks"] == [{"from": 2, "to": 1, "step": None, "attempt": 0, "host": "algo-2"}]
    record = faults.read_restarts(spec.host_dir("algo-1") / "output" / "data")[0]  # the trackers' restart event's
    assert record.restarted and record.reason.endswith("; the job goes on with 1 host(s) (min_instance_count)")
    lines = restart_lines({**store.merged(tmp_path), "MaxRestarts": 2})
    assert lines[-1] == "  shrank from 2 to 1 host(s) after attempt 0 (algo-2 gone; min_instance_count)"


def test_below_min_instance_count_or_without_it_the_job_ends_naming_why(tmp_path):
    spec = _spec(tmp_path / "a", least=2)
    restarted, supervisor = _after_loss(spec, gone=True)
    assert not restarted and spec.hosts == ["algo-1", "algo-2"]
    assert "algo-2 cannot come back" in supervisor.gave_up
    assert "1 host(s) would be left, fewer than min_instance_count 2" in supervisor.gave_up
    unset = _spec(tmp_path / "b", least=0)
    restarted, supervisor = _after_loss(unset, gone=True)
    assert not restarted and "cannot come back" in supervisor.gave_up and "min_instance_count" not in supervisor.gave_up
    assert "Shrinks" not in store.merged(tmp_path / "b")


def test_a_host_that_may_come_back_restarts_on_every_host(tmp_path):
    """The control: a plain lost host (fault=host) restarts where it ran, with no original world."""
    spec = _spec(tmp_path, least=1)
    restarted, _ = _after_loss(spec, gone=False)
    assert restarted and spec.hosts == ["algo-1", "algo-2"] and _hosts(spec, "algo-2") == ["algo-1", "algo-2"]
    assert attempt_environment(spec) == {faults.ATTEMPT_ENV: "1"}
    assert "Shrinks" not in store.merged(tmp_path)
    assert "goes on" not in faults.read_restarts(spec.host_dir("algo-1") / "output" / "data")[0].reason


def test_the_runtime_takes_the_lost_ranks_share_by_accumulation_only_after_a_shrink(monkeypatch):
    from types import SimpleNamespace

    from container.trainer import settings
    from launcher.wire.training.hyperparameters import TrainingHyperparameters

    hp = TrainingHyperparameters.model_validate({"train_batch_size": 2, "gradient_accumulation_steps": 3})
    rt = SimpleNamespace(params=ModelParallelParameters(), world_size=1, is_main=False)
    monkeypatch.delenv(ORIGINAL_WORLD_ENV, raising=False)
    assert (settings(rt, hp).micro_batch, settings(rt, hp).grad_accum) == (2, 3)  # control: no shrink
    monkeypatch.setenv(ORIGINAL_WORLD_ENV, "2")
    assert (settings(rt, hp).micro_batch, settings(rt, hp).grad_accum) == (2, 6)  # the global batch of 2 ranks: 12


def test_on_slurm_a_node_gone_with_no_spare_or_a_host_gone_injection_leaves_it_to_min_instance_count(
        tmp_path, monkeypatch):
    """The Slurm runner's reason names no advice against shrinking where the job may shrink."""
    from launcher.local.spec import RunnerError
    from launcher.slurm import commands
    from launcher.slurm.runner import SlurmRunner

    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr(commands, "hostnames", lambda nodelist: ["n1", "n2"])
    monkeypatch.setattr(commands, "job_nodes", lambda job_id: ["n1"])  # n2 left the allocation
    for least, advice in ((1, False), (0, True)):
        job = _spec(tmp_path / str(least), least=least)
        with pytest.raises(RunnerError, match="node n2 of algo-2 has left the allocation") as err:
            SlurmRunner().host_lost(job, "algo-2")
        assert ("not shrunk to fewer nodes" in str(err.value)) == advice
    monkeypatch.setattr(commands, "job_nodes", lambda job_id: ["n1", "n2"])  # still held: it would run there
    (job.host_dir("algo-2") / faults.HOST_GONE).touch()
    with pytest.raises(RunnerError, match="algo-2 cannot come back"):
        SlurmRunner().host_lost(job, "algo-2")


def test_a_slurm_job_that_may_shrink_keeps_its_allocation_when_a_node_fails(tmp_path):
    """Without --no-kill Slurm ends the whole job when a node fails, and nothing would go on."""
    from launcher.config.backends.slurm import SlurmSettings
    from launcher.slurm.script import sbatch_options

    assert "--no-kill" in sbatch_options(_spec(tmp_path / "a", least=1), SlurmSettings(), 0)
    assert "--no-kill" not in sbatch_options(_spec(tmp_path / "b", least=0), SlurmSettings(), 0)  # control


# --- rank 0's host, whose records are the job's -----------------------------------------------------
def test_rank_0_runs_on_the_first_host_left_as_resourceconfig_sorts_them(tmp_path):
    hosts = host_names(12)
    write_opt_ml(tmp_path, hyperparameters={}, current_host="algo-2", hosts=hosts[1:], instance_type="local",
                 channels={})
    config = json.loads((tmp_path / "input" / "config" / "resourceconfig.json").read_text())
    assert master_host(hosts[1:]) == config["hosts"][0] == "algo-10"  # the bootstrap's master: strings sorted
    assert rank0_hosts({}) == ["algo-1"]
    assert rank0_hosts({"Shrinks": [{"from": 12, "to": 11, "host": "algo-1"}]}) == ["algo-1", "algo-10"]
    assert rank0_hosts({"Shrinks": [{"from": 2, "to": 1, "host": "algo-2"}]}) == ["algo-1"]  # rank 0 stayed


def _shrunk_job(root, lost: str) -> None:
    """A job of 2 hosts that lost `lost` after step 4: rank 0's records before (algo-1's) and, on the host
    rank 0 ran on after it, steps 4 (the restart's event) to 6."""
    job = root / "j"
    before = [{"step": s, "loss": 10.0 - s} for s in range(1, 5)]
    after = [{"step": 4, "restarts": 1, "restart_reason": "algo-1 gone"},
             *({"step": s, "loss": 10.0 - s} for s in (5, 6))]
    for host, records, step in (("algo-1", before, 4), ("algo-2", after, 6)):
        data = job / "hosts" / host / "output" / "data"
        data.mkdir(parents=True)
        (data / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        write_progress(data, Progress(step=step, max_steps=6, loss=10.0 - step))
    store.write(job, {"TrainingJobName": "j", "TrainingJobStatus": "Completed", "LocalJobDir": str(job),
                      "Shrinks": [{"from": 2, "to": 1, "step": 4, "attempt": 0, "host": lost}]})


def test_a_job_that_lost_algo_1_reports_the_steps_rank_0_ran_on_the_host_left(tmp_path):
    from launcher.backends.jobdir import run_summary
    from launcher.backends.local import LocalBackend

    _shrunk_job(tmp_path / "a", lost="algo-1")
    backend = LocalBackend(root=tmp_path / "a")
    assert backend.progress("j").step == 6
    assert backend.metrics("j").series("loss") == ([1, 2, 3, 4, 5, 6], [9.0, 8.0, 7.0, 6.0, 5.0, 4.0])
    assert backend.metrics("j").restarts() == [4]
    summary = run_summary(store.read("j", tmp_path / "a"))
    assert (summary["first_step"], summary["steps"], summary["last_loss"]) == (1, 6, 4.0)
    # control: where the job lost algo-2, rank 0 stayed on algo-1, whose records are the job's
    _shrunk_job(tmp_path / "b", lost="algo-2")
    backend = LocalBackend(root=tmp_path / "b")
    assert backend.progress("j").step == 4
    assert backend.metrics("j").series("loss") == ([1, 2, 3, 4], [9.0, 8.0, 7.0, 6.0])


def test_a_job_that_lost_algo_1_uploads_rank_0s_tensorboard_directory_of_each_host_it_ran_on(tmp_path, monkeypatch):
    from launcher.local import artifacts

    uploaded = []
    monkeypatch.setattr(artifacts.s3io, "upload_tree", lambda root, uri, region: uploaded.append((root, uri)) or 0)
    # the control: a job that lost algo-2 kept rank 0 on algo-1, whose directory alone is uploaded
    for lost, ran_on in (("algo-1", ["algo-1", "algo-2"]), ("algo-2", ["algo-1"])):
        spec = _spec(tmp_path / lost, least=1)
        spec.tensorboard, spec.hosts = {"S3OutputPath": "s3://b/tb"}, [h for h in spec.hosts if h != lost]
        store.update(spec.job_dir, Shrinks=[{"from": 2, "to": 1, "step": 4, "attempt": 0, "host": lost}])
        uploaded.clear()
        artifacts.store(spec, with_model=False, note=lambda line: None)
        assert uploaded == [(spec.host_dir(host) / "output" / "tensorboard", "s3://b/tb/j/tensorboard-output")
                            for host in ran_on]
