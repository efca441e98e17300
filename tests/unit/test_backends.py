"""The backend interface: one set of calls for SageMaker, local and Slurm jobs.

Job handles name their backend; `submit --dry-run` works for each backend and writes nothing;
`smlaunch list` shows every backend's jobs with their duration, and says which backend it could
not ask; the job file's `backend` and `slurm:` section are checked against the rest of the job.
"""

from __future__ import annotations

import inspect
import json
import os
import tarfile

import pytest
import yaml
from click.testing import CliRunner

from launcher.backends import registry
from launcher.backends.base import BackendError
from launcher.backends.slurm import SlurmBackend
from launcher.cli.app import main
from launcher.config import backend_table, validate_job
from launcher.local import store
from launcher.wire.training.issues import ConfigError
from tests.support.fifth_backend import has_the_interface
from tests.support.train_runs import ROOT

JOB = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
       "instance_count": 2, "processes_per_host": 2, "hyperparameters": {"model_preset": "llama3-tiny"},
       "distribution": {"torch_distributed": {"enabled": True}}, "environment": {"HF_TOKEN": "hf_secretvalue123"}}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    for key in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    return tmp_path / "home"


def job_file(tmp_path, **fields):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **fields}))
    return path


@pytest.mark.parametrize("name", backend_table.names())
def test_every_backend_has_the_whole_interface(name):
    cls = backend_table.load(backend_table.named(name).engine)
    has_the_interface(cls)
    assert inspect.signature(cls.submit).parameters["detach"].kind is inspect.Parameter.KEYWORD_ONLY
    assert cls.name == name


@pytest.mark.parametrize(("handle", "parsed"), [
    ("my-job", (None, "my-job")), ("local:my-job", ("local", "my-job")), ("sagemaker:a-1", ("sagemaker", "a-1")),
    ("slurm:1234", ("slurm", "1234")), ("slurm:my-job", ("slurm", "my-job"))])
def test_handles_name_their_backend(handle, parsed):
    assert registry.parse_handle(handle) == parsed


@pytest.mark.parametrize(("handle", "words"), [
    ("k8s:job", "names backend 'k8s', which smlaunch does not have"), ("local:a_b", "contains '_'"),
    ("local:", "is empty")])
def test_bad_handles_are_refused(handle, words):
    with pytest.raises(ConfigError) as info:
        registry.parse_handle(handle)
    assert words in str(info.value)


def test_a_handle_of_another_backend_is_not_found_there(home):
    store.write(home / "jobs" / "done-1", {"TrainingJobName": "done-1", "TrainingJobStatus": "Completed"})
    result = CliRunner().invoke(main, ["status", "slurm:done-1"])
    assert result.exit_code == 1 and "no slurm job 'done-1'" in result.stderr
    result = CliRunner().invoke(main, ["status", "local:done-1"])
    assert result.exit_code == 0 and "done-1: Completed" in result.stdout and "backend: local" in result.stdout


@pytest.mark.parametrize("name", ["local", "kubernetes"])
def test_the_job_store_gives_a_backend_its_own_jobs_only(home, name):
    # one lookup (store.owned_record) for the job-directory backends and Kubernetes
    store.write(home / "jobs" / "slu-2", {"TrainingJobName": "slu-2", "TrainingJobStatus": "Completed",
                                         "Backend": "slurm"})
    backend = registry.backend_named(name)
    assert not backend.exists("slu-2") and registry.backend_named("slurm").exists("slu-2")  # the control
    with pytest.raises(BackendError, match=f"^job slu-2 is a slurm job, not a {name} one: use slurm:slu-2$"):
        backend._record("slu-2")
    with pytest.raises(BackendError, match="none-2"):
        backend._record("none-2")


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_dry_run_writes_nothing_and_masks_secrets(tmp_path, home, backend):
    result = CliRunner().invoke(main, ["submit", str(job_file(tmp_path)), "--backend", backend, "--dry-run",
                                       "--job-name", "dry-1"])
    assert result.exit_code == 0, result.output
    assert not home.exists()  # no job directory, no record
    assert "hf_secretvalue123" not in result.output
    if backend == "local":
        shown = json.loads(result.stdout)["LocalJob"]
        assert shown["Hosts"] == ["algo-1", "algo-2"] and shown["ProcessesPerHost"] == 2
        assert shown["Environment"]["HF_TOKEN"] == "****"
        assert json.loads(shown["HyperParameters"]["sagemaker_program"]) == "train.py"
    else:
        assert result.stdout.startswith("#!/bin/bash\n")
        for line in ("#SBATCH --job-name=dry-1", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1"):
            assert line in result.stdout.splitlines()
        assert f"-m launcher.local.supervise {home / 'jobs' / 'dry-1'}" in result.stdout


def test_slurm_script_takes_the_section_and_the_time_from_max_run(tmp_path, home):
    path = job_file(tmp_path, backend="slurm", max_run=3600, slurm={
        "partition": "gpu", "account": "proj", "sbatch": ["--constraint=h100", "--exclusive"]})
    result = CliRunner().invoke(main, ["submit", str(path), "--dry-run", "--job-name", "dry-2"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # max_run + the 120 s stop grace + a minute: smlaunch's own max_run stop comes before Slurm's
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --constraint=h100",
                 "#SBATCH --time=0-01:03:00"):
        assert line in lines
    assert not any("--gpus-per-node" in x for x in lines)  # CPU nodes


def test_slurm_spare_nodes_are_allocated_beyond_instance_count(tmp_path, home):
    path = job_file(tmp_path, backend="slurm", max_restarts=2, slurm={"spare_nodes": 1})
    result = CliRunner().invoke(main, ["submit", str(path), "--dry-run", "--job-name", "dry-4"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # a failed node leaves the allocation instead of ending the job (--no-kill), for the spare to take over
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --no-kill" in lines
    assert "1 spare node(s) for a lost node's host" in result.stdout
    control = CliRunner().invoke(main, ["submit", str(job_file(tmp_path, backend="slurm", max_restarts=2)),
                                        "--dry-run", "--job-name", "dry-5"])
    assert "#SBATCH --nodes=2" in control.stdout.splitlines() and "--no-kill" not in control.stdout


def test_slurm_gpus_come_from_the_instance_type(tmp_path, home):
    path = job_file(tmp_path, backend="slurm", instance_type="ml.p5.48xlarge", processes_per_host=None,
                    hyperparameters={"model_preset": "llama3-tiny", "distributed_backend": "nccl"})
    result = CliRunner().invoke(main, ["submit", str(path), "--dry-run", "--job-name", "dry-3", "--force"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --gpus-per-node=8" in result.stdout.splitlines()
    assert "2 node(s) x 8 process(es)" in result.stdout


@pytest.mark.parametrize(("fields", "words"), [
    ({"backend": "slurm", "slurm": {"sbatch": ["--nodes=4"]}}, "--nodes is written from the job (instance_count and"),
    ({"backend": "slurm", "slurm": {"spare_nodes": 1}}, "slurm.spare_nodes = 1: are allocated (and billed) for "
     "the whole job but only a restart uses them, and max_restarts is 0"),
    ({"backend": "slurm", "slurm": {"sbatch": ["--x\n#SBATCH --y"]}}, "is not one long sbatch option"),
    ({"backend": "slurm", "slurm": {"time": "soon"}}, "is not an sbatch time"),
    ({"slurm": {"partition": "debug"}}, "is only read by backend slurm, and the job runs on local"),
    ({"backend": "sagemaker"}, "runs on ml.* instances, and instance_type is local"),
    ({"backend": "local", "instance_type": "ml.p5.48xlarge"}, "runs on this machine, which is not a ml.p5.48xlarge"),
    ({"backend": "slurm", "instance_type": "local_gpu"}, "slurm.gpus_per_node = null: is needed with instance_type"),
    ({"backend": "slurm", "instance_type": "ml.p5.48xlarge", "processes_per_host": None,
      "slurm": {"gpus_per_node": 4}}, "differs from ml.p5.48xlarge's 8 accelerators"),
])
def test_backend_settings_are_checked(fields, words):
    with pytest.raises(ConfigError) as info:
        validate_job({**JOB, **fields})
    assert words in str(info.value)


def test_slurm_jobs_validate_like_local_ones(tmp_path):
    """Paths for channels and output (a shared file system), no AWS-only settings, the same degrees."""
    job = validate_job({**JOB, "backend": "slurm", "inputs": {"train": str(tmp_path)}, "output_path": str(tmp_path),
                        "subnets": ["subnet-1"], "security_group_ids": ["sg-1"]})
    assert job.config.backend_name == "slurm" and job.layout.world == 4
    assert any("has no effect with backend slurm" in str(w) for w in job.warnings)
    with pytest.raises(ConfigError, match="context_parallel_degree"):
        validate_job({**JOB, "backend": "slurm", "distribution": {"torch_distributed": {"enabled": True},
                      "smdistributed": {"modelparallel": {"enabled": True,
                                                          "parameters": {"context_parallel_degree": 3}}}}})


@pytest.mark.parametrize(("fields", "said"), [
    ({"backend": "slurm"}, "none: the nodes run the bootstrap with slurm.python (default: this Python)"),
    ({"backend": "slurm", "slurm": {"container_image": "nvcr.io#nvidia/pytorch:25.01-py3"}},
     "nvcr.io#nvidia/pytorch:25.01-py3 (srun --container-image)"),
    ({"local_runner": "docker", "image_uri": "mine:1"}, "mine:1 (local docker runner)")])
def test_validate_says_what_the_hosts_run(tmp_path, fields, said):
    """The image line of validate's summary is the backend's own (its row's image column)."""
    result = CliRunner().invoke(main, ["validate", str(job_file(tmp_path, **fields)), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["image"] == said


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_spot_settings_off_sagemaker_are_said_to_have_no_effect(backend, monkeypatch):
    """Issue 49: use_spot_instances and max_wait validated silently on local and Slurm runs (and got the
    spot rules of SageMaker: a max_wait under max_run refused, checkpoint_s3_uri asked for), where nothing
    carries them out. Whether a backend does is its row of the backend table (aws_settings)."""
    from dataclasses import replace

    from launcher.config import backend_table

    spot = {**JOB, "backend": backend, "use_spot_instances": True, "max_run": 3600, "max_wait": 1800}
    warned = {w.path: w.problem for w in validate_job(spot).warnings}
    assert warned["use_spot_instances"] == warned["max_wait"] == \
        f"has no effect with backend {backend} (SageMaker carries it out)"
    assert "checkpoint_s3_uri" not in warned
    # the control: a row that carries out SageMaker's settings gets the spot rules instead
    rows = tuple(replace(row, aws_settings=True) if row.name == backend else row for row in backend_table.BACKENDS)
    monkeypatch.setattr(backend_table, "BACKENDS", rows)
    with pytest.raises(ConfigError) as info:
        validate_job(spot)
    assert [i.path for i in info.value.issues] == ["max_wait"] and "is less than max_run" in str(info.value)
    assert "checkpoint_s3_uri" in [w.path for w in info.value.warnings]


def test_attach_gives_a_slurm_job_back_its_section_processes_and_code(home):
    """PyTorch.attach of a Slurm job: backend slurm, the slurm section and processes per node as its spec.json kept
    them, and the code as the first host got it (SlurmBackend.attach_fields)."""
    from launcher.sdk.estimator import PyTorch

    SlurmBackend()._prepare(validate_job({**JOB, "backend": "slurm", "slurm": {"partition": "gpu", "time": "2-0"}}),
                            "s-1")
    code = home / "jobs" / "s-1" / "hosts" / "algo-1" / "code"
    with tarfile.open(home / "jobs" / "s-1" / "sourcedir.tar.gz") as tar:  # as the first host's bootstrap does
        tar.extractall(code, filter="data")
    cfg = PyTorch.attach("slurm:s-1").config
    assert (cfg.backend, cfg.slurm.partition, cfg.slurm.time, cfg.processes_per_host) == ("slurm", "gpu", "2-0", 2)
    assert cfg.source_dir == str(code)


def test_slurm_submit_without_slurm_says_so_and_writes_nothing(tmp_path, home, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    result = CliRunner().invoke(main, ["submit", str(job_file(tmp_path, backend="slurm")), "--job-name", "s-1"])
    assert result.exit_code == 1
    assert "sbatch is not on PATH" in result.stderr and "Traceback" not in result.output
    assert not (home / "jobs" / "s-1").exists()


def test_list_shows_every_backend_with_duration(home):
    store.write(home / "jobs" / "loc-1", {"TrainingJobName": "loc-1", "TrainingJobStatus": "Completed",
                                          "CreationTime": "2026-11-01T10:00:00+00:00",
                                          "TrainingStartTime": "2026-11-01T10:00:05+00:00",
                                          "TrainingEndTime": "2026-11-01T11:01:06+00:00"})
    store.write(home / "jobs" / "slu-1", {"TrainingJobName": "slu-1", "TrainingJobStatus": "Failed", "Backend": "slurm",
                                          "SlurmJobId": "77", "CreationTime": "2026-11-02T10:00:00+00:00",
                                          "TrainingEndTime": "2026-11-02T10:00:30+00:00"})
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["list"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "-1" in line]
    assert "slurm:slu-1" in rows[0] and "Failed" in rows[0] and "0:00:30" in rows[0]  # newest first
    assert "local:loc-1" in rows[1] and "Completed" in rows[1] and "1:01:01" in rows[1]
    assert "sagemaker: not listed: no AWS region is configured" in result.stderr
    listed = json.loads(CliRunner().invoke(main, ["list", "--backend", "slurm", "--json"]).stdout)
    assert [(j["Handle"], j["DurationSeconds"]) for j in listed["jobs"]] == [("slurm:slu-1", 30)]
    assert listed["notes"] == []
    # slurm:<job id> finds the job by its Slurm id
    result = CliRunner().invoke(main, ["status", "slurm:77"])
    assert result.exit_code == 1 and "slu-1: Failed" in result.stdout and "backend: slurm" in result.stdout


def test_list_of_kubernetes_without_a_cluster_says_so(home, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    result = CliRunner().invoke(main, ["list", "--backend", "kubernetes"])
    assert result.exit_code == 1 and result.stdout == "", result.output  # not an empty table
    assert ("kubernetes: not listed: no Kubernetes cluster is configured here (no kubeconfig at "
            f"{tmp_path / 'no-kubeconfig'} and not in a pod)") in result.stderr
    (tmp_path / "no-kubeconfig").write_text("")  # the control: a kubeconfig, and no job submitted from here
    result = CliRunner().invoke(main, ["list", "--backend", "kubernetes"])
    assert result.exit_code == 0 and result.stderr == "" and "job" in result.stdout


def test_estimator_dry_runs_on_every_backend(tmp_path, home):
    from launcher import PyTorch

    args = {k: v for k, v in JOB.items() if k not in ("entry_point", "source_dir", "hyperparameters", "distribution")}
    est = PyTorch(entry_point="train.py", source_dir=JOB["source_dir"], hyperparameters=JOB["hyperparameters"],
                  distribution=JOB["distribution"], backend="slurm", **args)
    shown = est.dryrun(job_name="est-1")["SlurmJob"]
    assert shown["Nodes"] == 2 and "#SBATCH --nodes=2" in shown["BatchScript"]
    local = PyTorch(entry_point="train.py", source_dir=JOB["source_dir"], hyperparameters=JOB["hyperparameters"],
                    distribution=JOB["distribution"], **args)
    assert local.dryrun(job_name="est-2")["LocalJob"]["Hosts"] == ["algo-1", "algo-2"]
    assert not home.exists() and os.environ["SMLAUNCH_HOME"] == str(home)


def test_a_v3_model_trainer_runs_on_the_same_backends(home):
    from launcher import ModelTrainer
    from launcher.sdk.model_trainer import Compute, SourceCode, Torchrun

    trainer = ModelTrainer(source_code=SourceCode(source_dir=JOB["source_dir"], entry_script="train.py"),
                           compute=Compute(instance_type="local", instance_count=2), distributed=Torchrun(),
                           hyperparameters=JOB["hyperparameters"], backend="slurm", slurm={"partition": "debug"})
    shown = trainer.dryrun()["SlurmJob"]
    assert shown["Nodes"] == 2 and "#SBATCH --partition=debug" in shown["BatchScript"]
    assert not home.exists()


def test_a_v3_model_trainer_takes_each_backends_section_by_its_name(home):
    """ModelTrainer(kubernetes={...}) as ModelTrainer(slurm={...}): every section of the backend table's rows."""
    from launcher import ModelTrainer
    from launcher.sdk.model_trainer import Compute, SourceCode, Torchrun

    trainer = ModelTrainer(source_code=SourceCode(source_dir=JOB["source_dir"], entry_script="train.py"),
                           compute=Compute(instance_type="ml.p5.48xlarge", instance_count=2), distributed=Torchrun(),
                           hyperparameters=JOB["hyperparameters"], backend="kubernetes", training_image="repo/img:1",
                           kubernetes={"namespace": "ml", "storage": {"pvc": "fsx-claim"}})
    manifests = trainer.dryrun()["KubernetesJob"]["Manifests"]
    assert [m["metadata"]["namespace"] for m in manifests] == ["ml"] * len(manifests)
    with pytest.raises(ConfigError, match="kubernetes"):  # the control: a section of no backend is refused
        ModelTrainer(source_code=SourceCode(source_dir=JOB["source_dir"], entry_script="train.py"),
                     kubernetes_section={"namespace": "ml"})


def test_a_followed_jobs_failure_report_is_named_not_repeated():
    """The report a followed local job printed in its output (issue 38, item 8) is given by its first
    line; not followed, the whole reason; a one-line reason stays whole either way (the control)."""
    from launcher.backends.base import JobFailedError

    report = 'AlgorithmError: algo-1: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "fit.py exited with code 1'
    shown = str(JobFailedError("f1", "Failed", report, "/jobs/f1/logs/job.log", shown=True))
    assert shown == ("job f1 failed: AlgorithmError: algo-1: ExecuteUserScriptError (the whole report is in the "
                     "job's output above)\n  logs: /jobs/f1/logs/job.log")
    assert "ExitCode 1" in str(JobFailedError("f1", "Failed", report, "/jobs/f1/logs/job.log"))
    one_line = "MaxRuntimeExceeded: the job ran longer than max_run (60 s)"
    assert str(JobFailedError("f1", "Stopped", one_line, shown=True)) == f"job f1 stopped: {one_line}"
