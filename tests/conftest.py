"""Fixtures shared by the AWS-facing tests: no real network, and fake credentials for moto."""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

import pytest

# Inductor compiles in the process that asks, not in a pool of its own: on 2 cores a compiled
# rank's pool (a fresh interpreter importing torch and inductor, and its workers) cost 52 s of CPU
# where compiling in-process cost 43 s, for the same kernels (BENCHMARKS.md, the suite's CPU).
# Every process the tests start inherits it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# One OpenMP thread in every test process (torch's and MKL's pools), set before anything imports
# torch: three workers on two cores each ran torch with a pool of two, whose threads spin while
# they wait for work (libgomp's default), on cores the other workers needed: tests/unit took 187
# CPU s with the pools and 161 without (BENCHMARKS.md, the suite's time). The tests' tolerances
# hold for any thread count; the processes the tests start that set it already set 1.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The cyclic collector of a test process runs less often (Python's default is 700, 10, 10): collection
# imports ~1M objects and the tests add ~0.5M more (torch's, the SDKs' and hypothesis' caches), and
# each full collection walked them all (pytest_collection_finish, below).
gc.set_threshold(50_000, 20, 100)


def _one_botocore_loader_per_data_path() -> None:
    """Every botocore session in a test process shares one loader of AWS's service models: each
    new session (a boto3.Session, the SageMaker SDK's, moto's) otherwise parses the service JSON
    again (sagemaker's alone is megabytes), and the SDK parity tests create a dozen sessions each,
    most of their CPU. botocore already hands one loaded model to every client of a session, so
    sharing the loader shares nothing a session did not share before. The product's processes
    (the CLI in a subprocess) load as they always do."""
    try:
        import botocore.session
    except ImportError:  # the SDK extras are not installed: nothing to share
        return
    from functools import lru_cache

    botocore.session.create_loader = lru_cache(maxsize=None)(botocore.session.create_loader)


_one_botocore_loader_per_data_path()

# The fixtures of the helpers that unit and integration tests share (tests/support/), for every
# test: a fixture there may request another (the docker runner's `job` requests `channels`).
pytest_plugins = [
    "tests.support.durations",  # seconds per module and folder at the end; the recorded costs
    "tests.support.checkpoints",
    "tests.support.demo_job",  # the demo's layout submitted once per run, for the tests that only read it
    "tests.support.docker_runner",
    "tests.support.job_kind",
    "tests.support.model_trainer",
    "tests.support.model_rules",
    "tests.support.own_scripts",  # users' own scripts: tiny wheels, a launching environment of the test's
    "tests.support.pack",
    "tests.support.peft_reference",  # LoRA's tests: the tiny Llama peft and the runtime both load
    "tests.support.slurm_cluster",  # the session's local Slurm cluster
    "tests.support.sourcedir",
    "tests.support.worker_exit",  # an xdist worker leaves without its interpreter's teardown
]

# `make test` runs the suite on three workers (pytest-xdist: `-n 3 --dist loadfile`), and here
# loadfile keeps whole modules on one worker, so that a module's fixtures (a reference training
# run, a traced planner) are built once, not once per worker, and also keeps together the modules
# that share something a second worker must not start beside them: the Slurm tests one cluster per
# session, the container tests one image and podman store. (xdist's loadgroup does this with
# marks, but on pytest 9.2 its groups are silently lost: pytest-dev/pytest-xdist#1386.)
# The longest start first, by the seconds tests/durations.json records (`make durations`): xdist's
# own order (most tests first) started the traced planner and the container group last, and one
# worker ran them alone at the end while the other had finished.
SHARED_GROUPS = {
    "tests/e2e/test_slurm_backend.py": "slurm",
    "tests/e2e/test_slurm_cluster.py": "slurm",
    "tests/e2e/test_slurm_restarts.py": "slurm",
    "tests/e2e/test_slurm_tune.py": "slurm",
    "tests/e2e/test_docker_engine.py": "container-engine",
    "tests/e2e/test_kubernetes_podman.py": "container-engine",
    "tests/integration/test_docker_runner.py": "container-engine",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # another --dist, as asked
    from xdist.scheduler import LoadFileScheduling

    from tests.support.durations import estimate, longest, module_of, recorded

    seconds = estimate(recorded())

    class LongestModulesAndSharedGroupsFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = module_of(nodeid)
            return SHARED_GROUPS.get(module, module)

        def _assign_work_unit(self, node) -> None:
            self.workqueue.move_to_end(longest(self.workqueue, seconds), last=False)  # the unit xdist takes next
            super()._assign_work_unit(node)

    return LongestModulesAndSharedGroupsFirst(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, transformers, the SDKs, moto and every test module: ~1M objects)
    is frozen out of the collector's reach, as the runtime's agent freezes its imports before it forks
    its ranks. With the thresholds above, tests/unit's workers spent 1.6-2.2 s each in the collector
    where they spent 5.2-5.6 s of their ~37 CPU s (13 full collections of ~0.35 s; BENCHMARKS.md).
    What the tests make is collected as before."""
    gc.collect()  # the garbage of collection itself, before the rest is frozen for good
    gc.freeze()


REGION = "us-east-1"
SEED_BUCKET = "sagemaker-us-east-1-111122223333"  # the seed files' output_path bucket
LOCAL_S3_BUCKET = "smlaunch-local-test"  # the bucket of the `s3` fixture's server


@pytest.fixture(autouse=True)
def _terminal_width_of_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's tables are as wide as for output to a file, wherever the suite runs: xdist's
    workers start with COLUMNS=80 and LINES=24, which narrow a rich table until its cells wrap."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch):
    """Any real connection fails the test (moto's in-process mocks open none). A Unix socket is no
    network: a local job's supervisor, run in the test's process, reaches its hosts' agent template so."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to open a network connection")

    connect = socket.socket.connect

    def local_only(sock, address):
        if sock.family != socket.AF_UNIX:
            refuse()
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def fake_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials and region for moto; nothing from the developer's own AWS configuration."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_SECURITY_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """(train dir, validation dir): byte-level JSON Lines blocks of 64 tokens of this project's
    own source, as the training script reads them from its channels."""
    from tests.support.demo_job import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def aws(fake_credentials):
    """moto in-process AWS with the seed files' bucket created."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        session = boto3.Session(region_name=REGION)
        session.client("s3").create_bucket(Bucket=SEED_BUCKET)
        yield session


@pytest.fixture
def runtime_dir(tmp_path) -> Path:
    """A source_dir whose train.py runs smlaunch's runtime (the runtime's rules apply)."""
    (tmp_path / "train.py").write_text("from container.trainer import train\n")
    return tmp_path


@pytest.fixture
def user_script_dir(tmp_path) -> Path:
    """A source_dir whose train.py is a script of the user's own (the runtime's rules do not apply)."""
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "train.py").write_text("print('hi')\n")
    return tmp_path / "own"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """SMLAUNCH_HOME of this test: local jobs' records, logs and bundles."""
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def s3(fake_credentials, monkeypatch, tmp_path):
    """A moto S3 server on 127.0.0.1 that local jobs' processes reach (AWS_ENDPOINT_URL), with
    LOCAL_S3_BUCKET created: (client, endpoint). The server is a process of its own, apart from
    the worker's threads, with its request log in the test's moto-server.log: that log showed why
    a pod's mirror went silent for three minutes in two fresh clones (a PUT of progress.json
    answered 400 after boto3's read timeout, three times: launcher.wire.s3io.upload_file)."""
    import subprocess
    import sys

    import boto3

    from launcher.wire.opt_ml import free_port

    port = free_port()
    log = tmp_path / "moto-server.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, server, log)
        endpoint = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=LOCAL_S3_BUCKET)
        yield client, endpoint
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_for_port(port: int, server, log: Path, timeout: float = 60.0) -> None:
    """Until the server accepts connections on 127.0.0.1:port; its log if it exits or never does."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the moto server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the moto server did not listen on {port} in {timeout:.0f} s:\n{log.read_text()[-3000:]}")
