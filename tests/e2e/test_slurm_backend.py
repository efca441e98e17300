"""The Slurm backend against a real Slurm (tests/slurm_cluster.py: slurmctld and two slurmd on
127.0.0.1): the local demo's job, with only `backend: slurm` added, trains on 2 nodes x 2
processes with hybrid sharding and cp 2 exactly like one process; a failing rank fails the Slurm
job with its traceback in `status`; `stop` reaches the ranks with SIGTERM and they checkpoint.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.local import store
from tests.support.local_jobs import HP, HSD_CP, SCRIPT, cli_env, members, processes_in, wait_for
from tests.support.train_runs import ROOT, run_train, series


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def slurm_env(cluster, home: Path) -> dict[str, str]:
    return {**cli_env(home), **cluster.env}


def smlaunch(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def write_job(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def demo_job(tmp_path: Path, corpus, **fields) -> dict:
    """tests/integration/test_local_mode.py's job: 2 hosts x 2 processes, hybrid sharding 2, cp 2."""
    train, _ = corpus
    return {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
            "instance_count": 2, "processes_per_host": 2, "distribution": HSD_CP, "base_job_name": "slurm-e2e",
            "output_path": str(tmp_path / "artifacts"), "inputs": {"train": str(train)},
            "hyperparameters": {**HP, "checkpoint_freq": 2, "checkpoint_dir": "/opt/ml/checkpoints"}, **fields}


def submitted(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    """(name, Slurm job id) from `submitted NAME (Slurm job ID): DIR`."""
    line = next(x for x in proc.stdout.splitlines() if x.startswith("submitted "))
    return line.split()[1], line.split("Slurm job ")[1].split(")")[0]


def test_the_local_job_trains_on_two_slurm_nodes_like_one_process(tmp_path, home, corpus, slurm_cluster):
    env = slurm_env(slurm_cluster, home)
    data = demo_job(tmp_path, corpus, slurm={"partition": slurm_cluster.partition, "time": "10:00"})
    local = write_job(tmp_path / "local.yaml", demo_job(tmp_path, corpus))
    on_slurm = write_job(tmp_path / "slurm.yaml", {**data, "backend": "slurm"})
    # the two job files differ in the backend (and its section) only
    assert {k: v for k, v in yaml.safe_load(on_slurm.read_text()).items() if k not in ("backend", "slurm")} == \
        yaml.safe_load(local.read_text())

    proc = smlaunch("submit", str(on_slurm), env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    name, job_id = submitted(proc)
    assert "algo-1 | [metrics] step=4 loss=" in proc.stdout and "algo-2 | " in proc.stdout  # logs followed

    # Slurm ran one bootstrap per node, on n1 and n2, in one allocation of 2 nodes. The job's record is
    # final when submit returns; Slurm's may still say COMPLETING a moment (its nodes' cleanup): a fresh
    # clone's suite once read it then, so the test waits for Slurm's end as the restart tests do
    assert slurm_cluster.wait_ended(job_id, timeout=60) == "COMPLETED"
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    assert "NumNodes=2 " in shown and "JobState=COMPLETED" in shown and "NodeList=n[1-2]" in shown
    steps = (home / "jobs" / name / "logs" / "job.log").read_text()
    assert "2 host(s) x 2 process(es), slurm runner" in json.dumps(store.read(name, home / "jobs"))

    out = tmp_path / "artifacts" / name / "output"
    records = [json.loads(x) for x in members(out / "output.tar.gz")["metrics.jsonl"].decode().splitlines()]
    losses = series(records, "loss")
    assert len(losses) == 4 and "[metrics] step=4" in steps
    assert {"model.safetensors", "config.json"} <= set(members(out / "model.tar.gz"))
    reference = run_train(tmp_path / "ref", 1, **{**HP, "train_batch_size": 4}, training_dir=str(corpus[0]))
    assert losses == pytest.approx(series(reference, "loss"), rel=1e-5)

    status = smlaunch("status", f"slurm:{job_id}", env=env)
    assert status.returncode == 0 and f"{name}: Completed\n" in status.stdout
    assert "backend: slurm" in status.stdout and f"slurm job: {job_id}" in status.stdout
    listed = json.loads(smlaunch("list", "--backend", "slurm", "--json", env=env).stdout)
    assert [(j["Handle"], j["TrainingJobStatus"]) for j in listed["jobs"]] == [(f"slurm:{name}", "Completed")]
    # `smlaunch metrics` reads the job directory's metrics.jsonl: the records output.tar.gz holds
    shown = json.loads(smlaunch("metrics", f"slurm:{job_id}", "--json", env=env).stdout)
    assert [(m["job"], m["records"]) for m in shown] == [(f"slurm:{name}", records)]
    checkpoints = home / "jobs" / name / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-2", "step-4"]


def script_job(tmp_path: Path, cluster, **fields) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "job.py").write_text(SCRIPT)
    return write_job(tmp_path / "job.yaml", {
        "entry_point": "job.py", "source_dir": str(src), "instance_type": "local", "instance_count": 2,
        "backend": "slurm", "slurm": {"partition": cluster.partition}, "processes_per_host": 1,
        "distribution": {"torch_distributed": {"enabled": True}}, **fields})


def test_a_failing_rank_fails_the_slurm_job_with_its_traceback(tmp_path, home, slurm_cluster):
    env = slurm_env(slurm_cluster, home)
    proc = smlaunch("submit", str(script_job(tmp_path, slurm_cluster, environment={"FAIL_RANK": "1"})),
                    env=env, timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    name, job_id = submitted(proc)
    assert "ValueError: boom on rank 1" in proc.stdout  # in the host's lines; the error names the report
    status = smlaunch("status", f"slurm:{job_id}", env=env)
    assert f"{name}: Failed\n" in status.stdout
    assert "failure reason: AlgorithmError: algo-2: ExecuteUserScriptError:" in status.stdout
    assert "ValueError: boom on rank 1" in status.stdout
    assert slurm_cluster.wait_ended(job_id, timeout=60) == "FAILED"  # the batch step exits 1 as well
    assert processes_in(home / "jobs" / name) == []


def test_stop_sends_sigterm_and_the_ranks_checkpoint(tmp_path, home, corpus, slurm_cluster):
    env = slurm_env(slurm_cluster, home)
    data = demo_job(tmp_path, corpus, backend="slurm", slurm={"partition": slurm_cluster.partition},
                    hyperparameters={**HP, "max_steps": 10_000, "checkpoint_freq": 10_000,
                                     "checkpoint_dir": "/opt/ml/checkpoints"})
    proc = smlaunch("submit", str(write_job(tmp_path / "job.yaml", data)), "--no-wait", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    name, job_id = submitted(proc)
    log = home / "jobs" / name / "logs" / "job.log"
    wait_for(lambda: log.is_file() and log.read_text().count("[metrics] step=") >= 3, timeout=180)
    stop = smlaunch("stop", f"slurm:{job_id}", env=env)
    assert stop.returncode == 0 and f"stopping {name} (slurm)" in stop.stdout
    deadline = time.monotonic() + 180
    while store.read(name, home / "jobs")["TrainingJobStatus"] == "InProgress":
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    record = json.loads(smlaunch("status", name, "--json", env=env).stdout)
    assert record["TrainingJobStatus"] == "Stopped", record.get("FailureReason")
    text = log.read_text()
    assert "SIGTERM: stopping every host" in text and "SIGTERM: saved a checkpoint at step" in text
    saved = [p for p in (home / "jobs" / name / "checkpoints").iterdir() if p.name.startswith("step-")]
    assert len(saved) == 1 and (saved[0] / ".complete").is_file()
    # a stop is no failure, and status names the checkpoint it saved and the last logged step
    assert "[smlaunch] failed" not in text and "[smlaunch] stopped (exit code 143)" in text
    shown = smlaunch("status", name, env=env).stdout
    assert f"last checkpoint: step {saved[0].name.split('-')[1]}, {saved[0]}" in shown, shown
    assert re.search(r"last step: step \d+/10000 \(\d+%\), loss", shown) and "failure reason" not in shown
    slurm_cluster.wait_ended(job_id, timeout=60)
    assert processes_in(home / "jobs" / name) == []


# Every rank says what it runs in, in the model directory of its node.
IN_ITS_ENVIRONMENT = """
import json, os, sys
import pydantic, smlaunch_own_probe
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"prefix": sys.prefix, "pydantic": pydantic.VERSION, "probe": smlaunch_own_probe.VALUE}, f)
"""


def test_requirements_go_into_one_environment_in_the_job_directory(tmp_path, home, slurm_cluster, own_wheels):
    """The supervisor builds the job's environment once, on the shared job directory, before any
    node starts; every node's ranks run in it; the Python the nodes were given is left as it was."""
    from tests.support.own_scripts import PINNED, PROBE, installed, launching_environment, requirements, ship_wheels

    python = launching_environment(tmp_path / "nodes-python")
    before = installed(python)
    src = tmp_path / "src"
    src.mkdir()
    (src / "job.py").write_text(IN_ITS_ENVIRONMENT)
    (src / "requirements.txt").write_text(requirements("==".join(PROBE), "==".join(PINNED)))
    ship_wheels(src, own_wheels)
    job = write_job(tmp_path / "job.yaml", {
        "entry_point": "job.py", "source_dir": str(src), "instance_type": "local", "instance_count": 2,
        "backend": "slurm", "slurm": {"partition": slurm_cluster.partition, "python": str(python)},
        "distribution": {"torch_distributed": {"enabled": True}}})
    env = slurm_env(slurm_cluster, home)
    proc = smlaunch("submit", str(job), env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    name, _ = submitted(proc)
    job_dir = home / "jobs" / name
    record = store.read(name, home / "jobs")
    built = record["JobEnvironment"]
    assert (built["Path"], built["Python"], built["Reused"]) == (str(job_dir / "env"),
                                                                str(job_dir / "env" / "bin" / "python"), False)
    seen = [json.loads((job_dir / "hosts" / host / "model" / f"rank-{rank}.json").read_text())
            for host, rank in (("algo-1", 0), ("algo-2", 1))]
    assert seen == [{"prefix": str(job_dir / "env"), "pydantic": PINNED[1], "probe": 42}] * 2
    log = (job_dir / "logs" / "job.log").read_text()
    assert log.count(" -m pip install ") == 1
    assert log.count("requirements.txt is installed in the job's environment") == 2
    assert log.index("requirements.txt: built the job environment") < log.index("algo-1 | ")  # before any node
    assert installed(python) == before
    assert not (home / "envs").exists()  # per job on Slurm: nothing kept for other jobs
