"""The docker runner of local mode: its compose file (golden files: they are the spec), engine
detection and the commands it runs (fake executables on PATH). Real containers:
tests/e2e/test_docker_engine.py.
Here the tests that run in one process; those that start processes are tests/integration/test_docker_runner.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.local import docker
from launcher.local.docker import DockerRunner, Engine, compose_file, find_engine
from launcher.local.spec import RunnerError
from tests.support.docker_runner import (  # noqa: F401 - channels: a fixture `job` requests
    JOB,
    JOB_DIR,
    make_spec,
)

# --- the compose file ------------------------------------------------------------------------


def test_the_compose_file_keeps_the_sagemaker_contract(channels):
    compose = compose_file(make_spec(JOB_DIR, channels))
    assert list(compose["services"]) == ["algo-1", "algo-2"]
    assert compose["networks"] == {JOB: {"name": JOB}}
    for host, service in compose["services"].items():
        assert service["command"] == "train" and service["hostname"] == host
        assert service["networks"] == [JOB]  # where the service name, the host, resolves
        volumes = dict(v.split(":", 1) for v in service["volumes"])
        assert volumes[f"/jobs/{JOB}/hosts/{host}/output"] == "/opt/ml/output"
        assert volumes[f"/jobs/{JOB}/model"] == "/opt/ml/model"  # one for every host
        assert volumes[str(JOB_DIR / "sourcedir.tar.gz")] == "/opt/ml/sourcedir.tar.gz:ro"
        assert volumes[str(channels["tokenizer"])] == "/opt/ml/input/data/tokenizer/tokenizer.json:ro"
        assert all(Path(v.split(":")[0]).is_absolute() for v in service["volumes"])
        # The bootstrap must find the master by name, as on AWS: no local-mode override.
        assert not any(k.startswith("SMLAUNCH_MASTER") for k in service["environment"])
        assert service["environment"]["TRAINING_JOB_NAME"] == JOB
        assert "deploy" not in service  # CPU hosts reserve no GPU
    assert compose["services"]["algo-1"]["container_name"] != compose["services"]["algo-2"]["container_name"]


def test_every_dollar_is_written_as_composes_literal_dollar(channels):
    """Compose reads `$NAME`/`${NAME}` from the host's environment and `$$` as one `$` (both
    compose implementations; tests/e2e/test_docker_engine.py runs it on a real engine)."""
    environment = {"DB_PASSWORD": "pa$$word", "PLAIN": "ab$cd", "HOST_KEY_REF": "${AWS_SECRET_ACCESS_KEY}"}
    service = compose_file(make_spec(JOB_DIR, channels, environment=environment))["services"]["algo-1"]
    assert {k: service["environment"][k] for k in environment} == {
        "DB_PASSWORD": "pa$$$$word", "PLAIN": "ab$$cd", "HOST_KEY_REF": "$${AWS_SECRET_ACCESS_KEY}"}
    assert service["environment"]["TRAINING_JOB_NAME"] == JOB  # no '$': unchanged


def test_a_sharded_channel_mounts_each_hosts_own_part(tmp_path, channels):
    parts = {h: tmp_path / "shards" / h for h in ("algo-1", "algo-2")}
    for part in parts.values():
        part.mkdir(parents=True)
    spec = make_spec(JOB_DIR, channels, host_channels={h: {"train": p} for h, p in parts.items()})
    for host, service in compose_file(spec)["services"].items():
        assert f"{parts[host]}:/opt/ml/input/data/train:ro" in service["volumes"]
        assert f"{channels['train']}:/opt/ml/input/data/train:ro" not in service["volumes"]


def test_podman_gets_cdi_devices_instead_of_a_reservation(channels):
    spec = make_spec(JOB_DIR, channels, instance_type="local_gpu", gpus_per_host=[[0, 1], [2, 3]])
    services = compose_file(spec, "podman")["services"]
    assert services["algo-2"]["devices"] == ["nvidia.com/gpu=2", "nvidia.com/gpu=3"]
    assert "deploy" not in services["algo-2"]


def test_project_and_container_names_are_what_compose_accepts(channels):
    spec = make_spec(JOB_DIR, channels, name="My-Job.2026")
    assert docker.project_name(spec) == "my-job-2026"
    assert docker.container_name(spec, "algo-2") == "my-job-2026-algo-2"


def test_a_gpu_job_needs_a_gpu_list_per_host(channels):
    spec = make_spec(JOB_DIR, channels, instance_type="local_gpu", gpus_per_host=[[0]])
    with pytest.raises(RunnerError, match="one GPU list per host"):
        compose_file(spec)


def test_a_missing_channel_source_is_refused(tmp_path):
    with pytest.raises(RunnerError, match="channel 'train'.*does not exist"):
        compose_file(make_spec(JOB_DIR, {"train": tmp_path / "gone"}))


def test_the_submit_directory_is_the_mounted_archive(channels):
    spec = make_spec(JOB_DIR, channels)
    assert DockerRunner(Engine("docker", ("docker",), ("docker", "compose"))).submit_directory(spec) \
        == "/opt/ml/sourcedir.tar.gz"
    assert "/opt/ml/sourcedir.tar.gz:ro" in "\n".join(compose_file(spec)["services"]["algo-1"]["volumes"])


# --- engine detection (fake executables) ----------------------------------------------------


def test_no_engine_at_all_names_both_tries_and_the_fixes(bin_dir):
    with pytest.raises(RunnerError) as err:
        find_engine()
    message = str(err.value)
    assert "docker: not installed" in message and "podman: not installed" in message
    assert "--runner process" in message


# --- check, start and cleanup (fake engine) -------------------------------------------------


