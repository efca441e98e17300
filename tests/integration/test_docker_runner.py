"""The docker runner of local mode: its compose file (golden files: they are the spec), engine
detection and the commands it runs (fake executables on PATH). Real containers:
tests/e2e/test_docker_engine.py.
Here the tests that start processes; the rest are tests/unit/test_docker_runner.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import yaml

from launcher.local import docker
from launcher.local.docker import DockerRunner, Engine, compose_file, find_engine
from launcher.local.spec import LocalJobSpec, RunnerError
from tests.support.docker_runner import (  # noqa: F401 - channels: a fixture `job` requests
    JOB,
    JOB_DIR,
    RECORD,
    calls,
    fake,
    make_spec,
)

GOLDEN = Path(__file__).resolve().parents[1] / "support" / "golden"
UPDATE_GOLDEN = os.environ.get("SMLAUNCH_UPDATE_GOLDEN") == "1"
DATA = "/srv/data"  # where the channel sources appear in the golden files


def golden_yaml(spec: LocalJobSpec, tmp_path: Path, engine: str = "docker") -> str:
    text = yaml.safe_dump(compose_file(spec, engine), sort_keys=False)
    return text.replace(str(tmp_path), DATA)


def assert_golden(text: str, name: str) -> None:
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; review, then SMLAUNCH_UPDATE_GOLDEN=1"


# --- the compose file ------------------------------------------------------------------------

def test_two_cpu_hosts_match_the_golden_file(tmp_path, channels):
    assert_golden(golden_yaml(make_spec(JOB_DIR, channels), tmp_path), "compose_2hosts_cpu.yaml")


def test_local_gpu_matches_the_golden_file(tmp_path, channels):
    spec = make_spec(JOB_DIR, {"train": channels["train"]}, instance_type="local_gpu",
                     gpus_per_host=[[0, 1], [2, 3]], environment={})
    assert_golden(golden_yaml(spec, tmp_path), "compose_local_gpu.yaml")


# --- engine detection (fake executables) ----------------------------------------------------


NO_DAEMON = """\
case "$1" in
  info) echo "Client: Docker Engine"; echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. \
Is the docker daemon running?" >&2; exit 1;;
  *) exit 0;;
esac
"""
NO_PLUGIN = """\
case "$1" in
  compose) echo "docker: 'compose' is not a docker command." >&2; exit 1;;
  *) exit 0;;
esac
"""


def test_docker_with_the_compose_plugin(bin_dir):
    fake(bin_dir, "docker", "exit 0\n")
    fake(bin_dir, "podman", "exit 0\n")
    assert find_engine() == Engine("docker", ("docker",), ("docker", "compose"))


def test_docker_compose_v1_when_the_plugin_is_missing(bin_dir):
    fake(bin_dir, "docker", NO_PLUGIN)
    fake(bin_dir, "docker-compose", "exit 0\n")
    assert find_engine() == Engine("docker", ("docker",), ("docker-compose",))


def test_a_docker_client_without_a_daemon_falls_back_to_podman_compose(bin_dir):
    fake(bin_dir, "docker", NO_DAEMON)
    fake(bin_dir, "podman", NO_PLUGIN)  # podman 4.3 has no `podman compose`
    fake(bin_dir, "podman-compose", "exit 0\n")
    assert find_engine() == Engine("podman", ("podman",), ("podman-compose",))


def test_the_engine_variable_picks_podman(bin_dir, monkeypatch):
    fake(bin_dir, "docker", "exit 0\n")
    fake(bin_dir, "podman", "exit 0\n")
    monkeypatch.setenv(docker.ENGINE_ENV, "podman")
    assert find_engine() == Engine("podman", ("podman",), ("podman", "compose"))
    monkeypatch.setenv(docker.ENGINE_ENV, "containerd")
    with pytest.raises(RunnerError, match="use docker or podman"):
        find_engine()


def test_only_a_docker_client_is_no_engine(bin_dir):
    fake(bin_dir, "docker", NO_DAEMON)  # this machine: /usr/local/bin/docker, no daemon
    with pytest.raises(RunnerError) as err:
        find_engine()
    message = str(err.value)
    assert "docker:" in message and "daemon does not answer" in message
    assert "Cannot connect to the Docker daemon" in message
    assert "podman: not installed" in message
    assert "start the Docker daemon" in message and "apt-get install podman podman-compose" in message
    assert "--runner process" in message


def test_an_engine_without_compose_is_no_engine(bin_dir):
    fake(bin_dir, "docker", NO_PLUGIN)
    with pytest.raises(RunnerError, match=r"docker answers, but no compose command does"):
        find_engine()


# --- check, start and cleanup (fake engine) -------------------------------------------------


def test_check_accepts_a_present_image_and_explains_how_to_build_a_missing_one(engine, job):
    fake_engine, log = engine
    DockerRunner(fake_engine).check(job)
    assert calls(log) == [["image", "inspect", "smlaunch:latest"]]
    job.image = "nope:1"
    with pytest.raises(RunnerError) as err:
        DockerRunner(fake_engine).check(job)
    assert "No such image: nope:1" in str(err.value)
    assert "make image IMAGE=nope:1\n" in str(err.value)
    assert "make image IMAGE=nope:1 BASE_IMAGE=<image>" in str(err.value)


def test_check_refuses_podman_networks_where_host_names_do_not_resolve(tmp_path, job, monkeypatch):
    log = tmp_path / "podman.log"
    cli = fake(tmp_path / "podbin", "podman", RECORD.format(log=log) + """\
        [ "$1" = info ] && echo cni
        exit 0
        """)
    runner = DockerRunner(Engine("podman", (str(cli),), ("podman-compose",)))
    plugins = tmp_path / "cni"
    plugins.mkdir()
    monkeypatch.setattr(docker, "CNI_PLUGIN_DIRS", (str(plugins),))
    with pytest.raises(RunnerError, match="without the dnsname plugin"):
        runner.check(job)
    (plugins / "dnsname").write_text("")
    runner.check(job)  # with the plugin, the image check comes next and passes
    assert calls(log)[-1] == ["image", "inspect", "smlaunch:latest"]


def test_start_writes_the_compose_file_creates_then_attaches_one_process_per_host(engine, job):
    fake_engine, log = engine
    hosts = DockerRunner(fake_engine).start(job)
    outputs = {h.label: h.proc.communicate(timeout=30)[0].decode() for h in hosts}

    compose_path = job.job_dir / "docker-compose.yaml"
    assert yaml.safe_load(compose_path.read_text()) == compose_file(job)
    assert (job.job_dir / "model").is_dir() and job.checkpoint_dir.is_dir()
    # afresh: containers of an earlier attempt keep that attempt's environment (SMLAUNCH_ATTEMPT)
    assert calls(log)[0] == ["-f", str(compose_path), "-p", JOB, "up", "--no-start", "--force-recreate"]
    assert sorted(calls(log)[1:]) == [["start", "--attach", f"{JOB}-{h}"] for h in job.hosts]
    assert [h.label for h in hosts] == ["algo-1", "algo-2"]
    assert f"[{JOB}-algo-1] hello" in outputs["algo-1"]
    assert [h.proc.returncode for h in hosts] == [0, 3]  # each host's exit code reaches the supervisor
    for text in outputs.values():  # start_new_session: each process leads its own group
        pgid, pid = text.split("pgid ")[1].split(" pid ")
        assert pgid.strip() == pid.strip()


def test_start_reports_a_failed_create(engine, job, monkeypatch):
    monkeypatch.setenv("FAIL_COMPOSE", "1")
    with pytest.raises(RunnerError, match=f"(?s)creating the containers failed.*network {JOB} failed"):
        DockerRunner(engine[0]).start(job)
    assert (job.job_dir / "docker-compose.yaml").is_file()  # written before anything starts


def test_cleanup_takes_the_stack_down(engine, job):
    fake_engine, log = engine
    runner = DockerRunner(fake_engine)
    docker.write_compose_file(job)
    runner.cleanup(job)
    compose_path = str(job.job_dir / "docker-compose.yaml")
    assert calls(log) == [
        ["-f", compose_path, "-p", JOB, "down", "--timeout", "10", "--remove-orphans"],
        ["network", "rm", JOB],
    ]  # every file is ours: no chown container


def test_cleanup_with_podman_compose_passes_no_remove_orphans(engine, job):
    fake_engine, log = engine
    podman = Engine("podman", fake_engine.cli, fake_engine.compose)
    docker.write_compose_file(job, "podman")
    DockerRunner(podman).cleanup(job)
    assert calls(log)[0][-3:] == ["down", "--timeout", "10"]


def test_cleanup_hands_root_owned_files_back(engine, job, monkeypatch):
    fake_engine, log = engine
    uid, gid = os.getuid(), os.getgid()
    owner = uid + 1  # files appear to belong to someone else: the container's root
    monkeypatch.setattr(docker.os, "getuid", lambda: owner)
    DockerRunner(fake_engine).cleanup(job)
    run = [c for c in calls(log) if c[0] == "run"]
    assert run == [["run", "--rm", "--network", "none", "--ulimit=nofile=20000:20000",
                    "--ulimit=nproc=4096:4096", "-v", f"{job.job_dir}:/job0", "smlaunch:latest",
                    "chown", "-R", f"{owner}:{gid}", "/job0"]]


def test_a_failed_chown_is_reported_not_raised(engine, job, monkeypatch, caplog):
    monkeypatch.setattr(docker.os, "getuid", lambda: os.getgid() + 12345)
    monkeypatch.setenv("FAIL_RUN", "1")
    with caplog.at_level(logging.WARNING, logger=docker.__name__):
        DockerRunner(engine[0]).cleanup(job)
    assert "could not be handed back" in caplog.text and "permission denied" in caplog.text
