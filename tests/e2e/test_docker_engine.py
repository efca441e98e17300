"""The docker runner against a real engine (podman or Docker) and a real image: `make test`
installs podman and builds the image from local material (scripts/build-image.sh), and names it
in SMLAUNCH_DOCKER_IMAGE. The tests skip only where no engine answers.

- the demo's layout (2 hosts x 2 processes, hybrid sharding + cp 2) in containers trains with the
  same losses as the process runner, from the same job file;
- a failing host fails the job with its reason and stops the other;
- `smlaunch stop` reaches the ranks as SIGTERM inside the containers, which save a checkpoint;
- the files the containers write are handed back to the user;
- no container or network outlives its job;
- the image's processes import smlaunch's runtime from bytecode, compiling nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import yaml

from launcher.local import docker, store
from launcher.local.docker import DockerRunner, Engine
from launcher.local.spec import LocalJobSpec
from launcher.wire.faults import FAULT_ENV, Fault, fault_spec
from launcher.wire.hyperparameters import encode
from launcher.wire.opt_ml import write_opt_ml
from tests.support.demo_job import HYPERPARAMETERS
from tests.support.docker_runner import engine_image  # noqa: F401 - the fixture
from tests.support.local_jobs import cli_env, job_file, script_job, smlaunch, wait_for
from tests.support.train_runs import run_train


def left_behind(engine: Engine, project: str) -> list[str]:
    """Containers and networks of the compose project that still exist."""
    containers = subprocess.run([*engine.cli, "ps", "-a", "--format", "{{.Names}}"],
                                capture_output=True, text=True, check=True).stdout.split()
    networks = subprocess.run([*engine.cli, "network", "ls", "--format", "{{.Name}}"],
                              capture_output=True, text=True, check=True).stdout.split()
    return [n for n in containers if n.startswith(f"{project}-")] + [n for n in networks if n == project]


def submitted_name(stdout: str) -> str:
    return next(line.split()[1] for line in stdout.splitlines() if line.startswith("submitted "))


def metrics(output_archive: Path) -> list[dict]:
    with tarfile.open(output_archive) as tar:
        return [json.loads(line) for line in tar.extractfile("metrics.jsonl").read().decode().splitlines()]


def losses(records: list[dict]) -> list[tuple[int, str, float]]:
    return [(r["step"], key, r[key]) for r in records for key in ("loss", "val_loss") if key in r]


# --- the image ---------------------------------------------------------------------------------
def test_the_images_processes_import_the_runtime_from_bytecode(engine_image):  # noqa: F811
    """Every host's agent template imports the runtime: torch's modules compiled from source at each
    start cost 2.3 s more (bytecode checked by time was stale once mmdebstrap clamped the times of
    the base's files: scripts/build-image.sh)."""
    engine, image = engine_image
    verbose = subprocess.run([*engine.cli, "run", "--rm", "--network", "none", *docker.ULIMIT_FLAGS,
                              "--entrypoint", "python", image, "-v", "-c", "import container.distributed.forked_ranks"],
                             capture_output=True, text=True, check=True, timeout=120).stderr
    # `python -v` names a module's bytecode quoted, a source it compiles bare
    from_bytecode = re.findall(r"^# code object from '(\S+)'$", verbose, re.M)
    compiled = re.findall(r"^# code object from (/\S+\.py)$", verbose, re.M)
    assert compiled == [], f"{len(compiled)} modules compiled from source in {image}, e.g. {compiled[:3]}"
    assert len(from_bytecode) > 1000 and any("/torch/" in p for p in from_bytecode)  # the control: -v's lines were read


# --- training ----------------------------------------------------------------------------------

def test_the_demo_layout_trains_in_containers_like_the_process_runner(
        tmp_path, home, demo_process_job, engine_image):  # noqa: F811
    engine, image = engine_image
    process = demo_process_job  # the same job file with the process runner, submitted once per test run
    runs = {"process": process.output}
    out = tmp_path / "docker" / "artifacts"
    spec = job_file(tmp_path / "docker.yaml", output_path=str(out), image_uri=image, local_runner="docker",
                    inputs={"train": str(process.train), "validation": str(process.validation)},
                    hyperparameters=HYPERPARAMETERS)
    proc = smlaunch("submit", str(spec), "--job-name", "demo-docker", env=cli_env(home), timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "submitted demo-docker (local, docker runner)" in proc.stdout
    assert "submitted demo-process (local, process runner)" in process.stdout
    runs["docker"] = out / "demo-docker" / "output"

    # One job file, two runners, the same numbers: bit for bit (same torch, same CPU).
    reference, contained = (metrics(runs[r] / "output.tar.gz") for r in ("process", "docker"))
    assert len([r for r in contained if "loss" in r]) == 4
    assert losses(contained) == losses(reference)
    with tarfile.open(runs["docker"] / "model.tar.gz") as tar:
        assert {"model.safetensors", "config.json"} <= set(tar.getnames())

    job = home / "jobs" / "demo-docker"
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert {p.name for p in (job / "checkpoints" / "step-4").glob("*.distcp")} == {
        f"__{r}_0.distcp" for r in range(4)}  # every rank of both containers wrote its shard
    compose = yaml.safe_load((job / "docker-compose.yaml").read_text())
    assert {s["image"] for s in compose["services"].values()} == {image}
    record = store.read("demo-docker")
    assert record["TrainingJobStatus"] == "Completed" and record["HostExitCodes"] == {"algo-1": 0, "algo-2": 0}
    assert left_behind(engine, "demo-docker") == []
    assert not docker._foreign_owner(job, os.getuid())  # the user can remove the job
    assert not docker._foreign_owner(runs["docker"], os.getuid())


def test_requirements_are_installed_inside_the_containers_as_the_toolkit_does(tmp_path, home, engine_image):  # noqa: F811
    """The docker runner builds no environment here: each container's bootstrap pip-installs
    requirements.txt into the image's Python (from wheels the code ships), as on SageMaker."""
    from tests.support.own_scripts import PINNED, PROBE, wheels

    engine, image = engine_image
    src = tmp_path / "src"
    wheels(src / "wheels")
    (src / "job.py").write_text("import pydantic, smlaunch_own_probe, sys\n"
                                "print('pydantic', pydantic.VERSION, 'probe', smlaunch_own_probe.VALUE)\n")
    (src / "requirements.txt").write_text("--no-index\n--find-links ./wheels\n"  # ./: the code directory
                                          f"{'=='.join(PROBE)}\n{'=='.join(PINNED)}\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"entry_point": "job.py", "source_dir": str(src), "instance_type": "local",
                                    "image_uri": image, "local_runner": "docker"}))
    proc = smlaunch("submit", str(spec), "--job-name", "reqs-docker", env=cli_env(home), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "installing the code's requirements.txt" in proc.stdout
    assert f"pydantic {PINNED[1]} probe 42" in proc.stdout
    assert "JobEnvironment" not in store.read("reqs-docker") and not (home / "envs").exists()
    assert left_behind(engine, "reqs-docker") == []


# --- failures and stops ------------------------------------------------------------------------

def test_a_failing_host_fails_the_job_and_stops_the_other(tmp_path, home, engine_image):  # noqa: F811
    engine, image = engine_image
    spec = script_job(tmp_path, environment={"FAIL_RANK": "1"}, image_uri=image, local_runner="docker")
    proc = smlaunch("submit", str(spec), "--job-name", "fails-docker", env=cli_env(home), timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "submitted fails-docker (local, docker runner)" in proc.stdout
    assert "ValueError: boom on rank 1" in proc.stdout  # in the host's lines; the error names the report
    status = smlaunch("status", "fails-docker", env=cli_env(home))
    assert "fails-docker: Failed\n" in status.stdout
    assert "failure reason: AlgorithmError: algo-2: ExecuteUserScriptError:\nExitCode 1\n" in status.stdout
    record = store.read("fails-docker")
    # algo-1's rank sleeps for 600 s: it ended because the runner stopped its container.
    assert record["HostExitCodes"]["algo-2"] == 1 and record["HostExitCodes"]["algo-1"] != 0
    assert left_behind(engine, "fails-docker") == []


def test_stop_reaches_the_ranks_in_the_containers_which_save_a_checkpoint(tmp_path, home, engine_image):  # noqa: F811
    engine, image = engine_image
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "entry_point": "train.py", "source_dir": str(Path(__file__).parents[2] / "entrypoints"),
        "instance_type": "local", "instance_count": 2, "local_runner": "docker", "image_uri": image,
        "distribution": {"torch_distributed": {"enabled": True}},
        "hyperparameters": {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64,
                            "max_steps": 1_000_000, "train_batch_size": 2, "logging_freq": 5,
                            "checkpoint_freq": 1_000_000, "checkpoint_dir": "/opt/ml/checkpoints"}}))
    env = cli_env(home)
    submitted = smlaunch("submit", str(spec), "--no-wait", "--job-name", "stop-docker", env=env, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    assert "(local, docker runner)" in submitted.stdout
    job = home / "jobs" / "stop-docker"
    progress = job / "hosts" / "algo-1" / "output" / "data" / "progress.json"
    wait_for(lambda: progress.is_file() and json.loads(progress.read_text())["step"] >= 10, timeout=180)

    stop = smlaunch("stop", "stop-docker", env=env)
    assert stop.returncode == 0, stop.stderr
    wait_for(lambda: store.read("stop-docker")["TrainingJobStatus"] != "InProgress", timeout=200)
    log = (job / "logs" / "job.log").read_text()
    saved = int(re.search(r"SIGTERM: saved a checkpoint at step (\d+) and stopping", log).group(1))
    assert saved >= 10
    status = smlaunch("status", "stop-docker", env=env)
    assert "stop-docker: Stopped\n" in status.stdout, status.stdout
    assert f"last checkpoint: step {saved}, {job / 'checkpoints' / f'step-{saved}'}" in status.stdout
    assert {p.name for p in (job / "checkpoints" / f"step-{saved}").glob("*.distcp")} == {
        "__0_0.distcp", "__1_0.distcp"}  # both hosts' ranks saved before leaving
    assert left_behind(engine, "stop-docker") == []


def test_a_killed_rank_and_a_killed_container_restart_the_job_in_containers(tmp_path, home, engine_image):  # noqa: F811
    """max_restarts 2: rank 1 is SIGKILLed before step 3 (its container's bootstrap restarts
    torchrun, as do the others'); in the next attempt rank 1 hangs before step 6 and the test kills
    its whole container (`<engine> kill`), which the supervisor restarts with every host. The job
    ends Completed with the losses of an uninterrupted run."""
    engine, image = engine_image
    faults = fault_spec(Fault("signal", rank=1, step=3, attempt=0), Fault("hang", rank=1, step=6, attempt=1))
    hyperparameters = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64,
                       "max_steps": 8, "train_batch_size": 2, "lr": 0.03, "warmup": 0.0, "min_lr": 0.003,
                       "logging_freq": 1, "seed": 7, "checkpoint_freq": 2,
                       "checkpoint_dir": "/opt/ml/checkpoints", "step_timeout": 300}  # the test ends the hang
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "entry_point": "train.py", "source_dir": str(Path(__file__).parents[2] / "entrypoints"),
        "instance_type": "local", "instance_count": 2, "local_runner": "docker", "image_uri": image,
        "distribution": {"torch_distributed": {"enabled": True}}, "max_restarts": 2,
        "hyperparameters": hyperparameters, "environment": {FAULT_ENV: faults}}))
    env = cli_env(home)
    submitted = smlaunch("submit", str(spec), "--no-wait", "--job-name", "restarts-docker", env=env, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    log = home / "jobs" / "restarts-docker" / "logs" / "job.log"
    try:
        wait_for(lambda: log.is_file() and "hang on rank 1 at step 6" in log.read_text(), timeout=240)
        subprocess.run([*engine.cli, "kill", docker.container_name(store_spec("restarts-docker", home), "algo-2")],
                       check=True, capture_output=True, timeout=60)
        wait_for(lambda: store.read("restarts-docker")["TrainingJobStatus"] != "InProgress", timeout=300)
    finally:  # a job that did not end (a hang not ended by the kill) is stopped, not left running
        if store.read("restarts-docker")["TrainingJobStatus"] == "InProgress":
            smlaunch("stop", "restarts-docker", env=env)

    text = log.read_text()
    status = smlaunch("status", "restarts-docker", env=env).stdout
    assert "restarts-docker: Completed\n" in status and "restarts: 2 of 2 (max_restarts)" in status, text[-4000:]
    assert "attempt 0 failed at step 2" in status and "SIGKILL" in status.split("attempt 0 failed")[1]
    assert ("algo-2 was killed by SIGKILL without a failure report: the host's processes are gone: restarting "
            "the job on every host (restart 2 of 2, max_restarts)") in text
    assert "(fault, restarted): algo-2 was killed by SIGKILL without a failure report" in status
    with tarfile.open(home / "jobs" / "restarts-docker" / "output" / "output.tar.gz") as tar:
        records = [json.loads(x) for x in tar.extractfile("metrics.jsonl").read().decode().splitlines()]
    last = {r["step"]: r["loss"] for r in records if "loss" in r}
    reference = run_train(tmp_path / "ref", 2, **{**hyperparameters, "checkpoint_dir": None, "step_timeout": None})
    assert last == {r["step"]: r["loss"] for r in reference if "loss" in r}
    assert len([r for r in records if "loss" in r]) > len(last)  # control: steps were replayed
    assert left_behind(engine, "restarts-docker") == []


def store_spec(name: str, home: Path) -> LocalJobSpec:
    return LocalJobSpec.load(home / "jobs" / name)


# --- the runner, driven directly ---------------------------------------------------------------

SCRIPT = """\
import json, os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
host = os.environ["SM_CURRENT_HOST"]
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "host.txt"), "w") as f:
    f.write(socket.gethostname())
if dist.get_rank() == 0:
    train = os.path.join(os.environ["SM_CHANNEL_TRAIN"], "train.jsonl")
    tokenizer = os.path.join(os.environ["SM_CHANNEL_TOKENIZER"], "tokenizer.json")
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "result.json"), "w") as f:
        json.dump({"sum": total.item(), "world": dist.get_world_size(), "host": host,
                   "train": open(train).read(), "tokenizer": open(tokenizer).read(),
                   "master": os.environ["MASTER_ADDR"]}, f)
dist.barrier()
dist.destroy_process_group()
"""


def script_spec(tmp_path: Path, image: str, runner: DockerRunner) -> LocalJobSpec:
    """A two-host job of SCRIPT with a directory channel and a single-file channel."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.jsonl").write_text('{"input_ids": [1, 2]}\n')
    (tmp_path / "tokenizer.json").write_text("{}")
    channels = {"train": tmp_path / "corpus", "tokenizer": tmp_path / "tokenizer.json"}
    name = "script-docker"
    job_dir = tmp_path / "jobs" / name
    spec = LocalJobSpec(name=name, job_dir=job_dir, hosts=["algo-1", "algo-2"], instance_type="local",
                        processes_per_host=1, hyperparameters={}, channels=channels,
                        environment={"OMP_NUM_THREADS": "1"}, checkpoint_dir=job_dir / "checkpoints",
                        max_run=600, image=image)
    hps = encode({"sagemaker_program": "script.py", "sagemaker_submit_directory": runner.submit_directory(spec),
                  "sagemaker_torch_distributed_enabled": True, "sagemaker_smlaunch_processes_per_host": 1,
                  "sagemaker_job_name": name})
    for host in spec.hosts:
        write_opt_ml(spec.host_dir(host), hyperparameters=hps, current_host=host, hosts=spec.hosts,
                     instance_type="local", channels=channels)
    (tmp_path / "script.py").write_text(SCRIPT)
    with tarfile.open(spec.source_archive, "w:gz") as tar:
        tar.add(tmp_path / "script.py", arcname="script.py")
    return spec


def test_a_two_host_script_job_finds_its_master_and_channels_and_gives_files_back(
        tmp_path, engine_image, monkeypatch):  # noqa: F811
    engine, image = engine_image
    runner = DockerRunner(engine)
    spec = script_spec(tmp_path, image, runner)
    runner.check(spec)
    hosts = runner.start(spec)
    try:
        outputs = [h.proc.communicate(timeout=300)[0].decode(errors="replace") for h in hosts]
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.proc.kill()
        # The user, as far as the runner knows, is not the containers' root (uid 0 here): every
        # file the containers wrote must be handed over to them.
        monkeypatch.setattr(docker.os, "getuid", lambda: 4242)
        monkeypatch.setattr(docker.os, "getgid", lambda: 4343)
        runner.cleanup(spec)
    assert [h.proc.returncode for h in hosts] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    result = json.loads((spec.job_dir / "model" / "result.json").read_text())
    assert result == {"sum": 3.0, "world": 2, "host": "algo-1", "train": '{"input_ids": [1, 2]}\n',
                      "tokenizer": "{}", "master": "algo-1"}
    for host in spec.hosts:
        assert (spec.host_dir(host) / "output" / "success").is_file()
        assert (spec.host_dir(host) / "output" / "data" / "host.txt").read_text() == host
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [spec.job_dir, *spec.job_dir.rglob("*")]}
    assert owners == {(4242, 4343)}
    assert left_behind(engine, "script-docker") == []
    shutil.rmtree(spec.job_dir)


# --- environment values reach the containers as written ---------------------------------------

ENV_SCRIPT = """import json, os
names = ("DB_PASSWORD", "PLAIN", "HOST_KEY_REF", "BRACES")
json.dump({n: os.environ.get(n) for n in names}, open(os.path.join(os.environ["SM_MODEL_DIR"], "env.json"), "w"))
"""


def test_dollar_signs_reach_both_runners_as_written(tmp_path, home, engine_image):  # noqa: F811
    """Issue 31, item 9: compose interpolates `$` from the host's environment; the values must
    arrive as the job wrote them, the same on the process and the docker runner."""
    engine, image = engine_image
    environment = {"DB_PASSWORD": "pa$$word", "PLAIN": "ab$cd", "HOST_KEY_REF": "${AWS_SECRET_ACCESS_KEY}",
                   "BRACES": "x${cd:-default}$"}
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "env_job.py").write_text(ENV_SCRIPT)
    seen = {}
    for runner in ("process", "docker"):
        out = tmp_path / runner
        spec = tmp_path / f"{runner}.yaml"
        spec.write_text(yaml.safe_dump({"entry_point": "env_job.py", "source_dir": str(tmp_path / "src"),
                                        "instance_type": "local", "local_runner": runner, "image_uri": image,
                                        "output_path": str(out), "environment": environment}))
        env = cli_env(home, AWS_SECRET_ACCESS_KEY="HOST-KEY-NOT-THE-JOBS", cd="HOST-CD")
        proc = smlaunch("submit", str(spec), "--job-name", f"dollar-{runner}", env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with tarfile.open(out / f"dollar-{runner}" / "output" / "model.tar.gz") as tar:
            seen[runner] = json.loads(tar.extractfile("env.json").read())
    assert seen["docker"] == seen["process"] == environment
    assert left_behind(engine, "dollar-docker") == []
