"""What the unit and integration tests of docker_runner share (tests/{unit,integration}/test_docker_runner.py)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from launcher.local import docker
from launcher.local.docker import Engine, find_engine
from launcher.local.spec import LocalJobSpec, RunnerError
from launcher.wire.opt_ml import write_opt_ml

JOB = "demo-2026-11-22-00-00-00-000"
IMAGE_ENV = "SMLAUNCH_DOCKER_IMAGE"  # the image `make test` built (scripts/build-image.sh) for the engine tests


@pytest.fixture(scope="module")
def engine_image() -> tuple[Engine, str]:
    """The engine and the image of the real-engine tests (tests/e2e); skip where no engine answers."""
    image = os.environ.get(IMAGE_ENV) or docker.DEFAULT_IMAGE
    try:
        engine = find_engine()
    except RunnerError as exc:
        pytest.skip(f"no container engine answers: {exc}".replace("\n", " "))
    inspect = subprocess.run([*engine.cli, "image", "inspect", image], capture_output=True, check=False)
    if inspect.returncode != 0:
        if os.environ.get(IMAGE_ENV):  # make test built it: its absence is a failure
            pytest.fail(f"{IMAGE_ENV}={image}, but {engine.name} has no such image")
        pytest.skip(f"{engine.name} has no image {image}: build it with `make image`")
    return engine, image


JOB_DIR = Path("/jobs") / JOB


def make_spec(job_dir: Path, channels: dict[str, Path], **kw) -> LocalJobSpec:
    return LocalJobSpec(**{
        "name": JOB, "job_dir": job_dir, "hosts": ["algo-1", "algo-2"], "instance_type": "local",
        "processes_per_host": 2, "hyperparameters": {}, "channels": channels,
        "environment": {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "WARN"},
        "checkpoint_dir": job_dir / "checkpoints", "max_run": 3600, "image": "smlaunch:latest",
        **kw,
    })


@pytest.fixture
def channels(tmp_path) -> dict[str, Path]:
    """A directory channel and a single-file channel (real paths: files and directories mount
    differently)."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.jsonl").write_text('{"input_ids": [1, 2]}\n')
    (tmp_path / "tokenizer.json").write_text("{}")
    return {"train": tmp_path / "corpus", "tokenizer": tmp_path / "tokenizer.json"}


def fake(bin_dir: Path, name: str, script: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    path.chmod(0o755)
    return path


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.delenv(docker.ENGINE_ENV, raising=False)
    return path


RECORD = """\
echo "$0 $*" >> "{log}"
"""


FAKE_DOCKER = RECORD + """\
case "$1" in
  image) [ "$3" = "smlaunch:latest" ] || {{ echo "Error: No such image: $3" >&2; exit 1; }};;
  start) echo "[$3] hello"; echo "[$3] pgid $(cut -d' ' -f5 /proc/$$/stat) pid $$";
         case "$3" in *algo-2) exit 3;; esac;;
  run) [ -n "$FAIL_RUN" ] && {{ echo "permission denied" >&2; exit 125; }};;
esac
exit 0
"""


FAKE_COMPOSE = RECORD + """\
[ -n "$FAIL_COMPOSE" ] && {{ echo "network {project} failed" >&2; exit 1; }}
exit 0
"""


@pytest.fixture
def engine(tmp_path) -> tuple[Engine, Path]:
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "fakebin"
    cli = fake(bin_dir, "docker", FAKE_DOCKER.format(log=log))
    compose = fake(bin_dir, "docker-compose", FAKE_COMPOSE.format(log=log, project=JOB))
    return Engine("docker", (str(cli),), (str(compose),)), log


def calls(log: Path) -> list[list[str]]:
    return [line.split()[1:] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def job(tmp_path, channels) -> LocalJobSpec:
    spec = make_spec(tmp_path / "jobs" / JOB, channels)
    for host in spec.hosts:
        write_opt_ml(spec.host_dir(host), hyperparameters={}, current_host=host, hosts=spec.hosts,
                     instance_type="local", channels=channels)
    spec.source_archive.write_bytes(b"")
    return spec
