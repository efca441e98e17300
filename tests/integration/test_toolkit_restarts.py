"""max_restarts on SageMaker, run as AWS's PyTorch images run a job: their `train` (sagemaker-training
5.1.4's trainer with the framework layer sagemaker-pytorch-training 3.0.0 as SAGEMAKER_TRAINING_MODULE)
on a /opt/ml tree made of the request and the code archive smlaunch builds (launcher.wire.restart_loop,
container/toolkit/restart_loop.py, docs/container.md).

The tree's code is the archive itself, as the SDK's network isolation hands it over (a local path:
the toolkit extracts it as it would the S3 object). SM_STUDIO_LOCAL_MODE is the toolkit's own switch
that skips its wait for the hosts' DNS names (`algo-1` has none here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from launcher.backends.sagemaker import SageMakerBackend
from launcher.backends.sourcedir import build_job_sourcedir
from launcher.config import validate_job
from launcher.wire import faults, restart_loop
from launcher.wire.faults import FAULT_ENV, Fault, fault_spec
from launcher.wire.hyperparameters import decode, encode
from launcher.wire.opt_ml import write_opt_ml

pytest.importorskip("sagemaker_training")
pytest.importorskip("sagemaker_pytorch_container")

ROOT = Path(__file__).resolve().parents[2]
ROLE = "arn:aws:iam::111122223333:role/SageMakerExecutionRole"
# One GPU instance (torch_distributed on SageMaker needs GPUs); on this CPU host both launches start
# one process, the toolkit's for want of GPUs (nvidia-smi) and the loop's (CPU: processes_per_host 1).
INSTANCE = "ml.g5.xlarge"
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 6,
      "train_batch_size": 2, "checkpoint_freq": 2, "logging_freq": 1}
KILLED = fault_spec(Fault("signal", rank=0, step=3, attempt=0))  # SIGKILL at step 3, first attempt only
TIMEOUT_S = 300
FRAMEWORK = "sagemaker_pytorch_container.training:main"  # what AWS's PyTorch training images set
USER_IMAGE = {"framework_version": "2.8.0", "py_version": "py312"}  # a user script names its DLC


def _job(max_restarts: int, environment: dict, **fields):
    data = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "role": ROLE, "region": "us-east-1",
            "instance_type": INSTANCE, "output_path": "s3://bucket/output/", "hyperparameters": HP,
            "distribution": {"torch_distributed": {"enabled": True}}, "environment": environment,
            "max_restarts": max_restarts, **fields}
    return validate_job(data, base_dir=ROOT)


def _tree(tmp_path: Path, job) -> tuple[Path, dict]:
    """The host's /opt/ml as SageMaker lays it out for the job's request."""
    request = SageMakerBackend(region="us-east-1").dryrun(job, job_name="restarts-1", build=False).request
    archive = build_job_sourcedir(job, tmp_path / "sourcedir.tar.gz").path
    hyperparameters = decode(request["HyperParameters"])
    hyperparameters["sagemaker_submit_directory"] = str(archive)
    base = tmp_path / "algo-1" / "opt" / "ml"
    write_opt_ml(base, hyperparameters=encode(hyperparameters), current_host="algo-1", hosts=["algo-1"],
                 instance_type=request["ResourceConfig"]["InstanceType"], channels={})
    return base, request


def _train(base: Path, request: dict) -> subprocess.CompletedProcess:
    """The image's `train` command on the tree, with the request's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "SMLAUNCH_"))}
    env.pop("PYTHONPATH", None)
    env.update(request.get("Environment", {}))
    env.update({"SAGEMAKER_BASE_DIR": str(base), "SAGEMAKER_TRAINING_MODULE": FRAMEWORK,
                "SM_STUDIO_LOCAL_MODE": "true", "TMPDIR": str(base.parent), "OMP_NUM_THREADS": "1",
                # the toolkit runs `torchrun` from PATH: this interpreter's
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"})
    return subprocess.run([sys.executable, "-c", "from sagemaker_training.cli.train import main; main()"],
                          cwd=base.parent, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_a_killed_rank_is_restarted_under_the_toolkit(tmp_path):
    base, request = _tree(tmp_path, _job(1, {FAULT_ENV: KILLED}))
    proc = _train(base, request)
    output = proc.stdout[-4000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, output
    assert (base / "output" / "success").exists() and not (base / "output" / "failure").exists(), output
    # the toolkit ran the loop, which ran train.py under torchrun twice, the second time as attempt 1
    logged = proc.stdout + proc.stderr  # the toolkit passes the script's stderr on to its stdout
    assert "python -- _smlaunch/restart_loop.py" in logged, output
    assert "max_restarts 1: smlaunch's restart loop runs train.py" in logged, output
    assert "restart 1 of 1 (max_restarts)" in logged, output
    [record] = faults.read_restarts(base / "output" / "data")
    assert (record.attempt, record.restarted, record.failure_class) == (0, True, faults.FAULT)
    assert record.rank == 0 and "SIGKILL" in record.reason, record
    # the restart resumed and finished: its checkpoint of the last step is there
    assert (base / "checkpoints" / f"step-{HP['max_steps']}" / ".complete").is_file(), output


def test_a_fault_that_repeats_fails_with_every_reason(tmp_path):
    """The toolkit writes its failure file only where none exists: FailureReason is the loop's."""
    every_attempt = fault_spec(Fault("signal", rank=0, step=3))
    base, request = _tree(tmp_path, _job(2, {FAULT_ENV: every_attempt}))
    proc = _train(base, request)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-6000:]
    failure = (base / "output" / "failure").read_text()
    assert failure.startswith('ExecuteUserScriptError:\nExitCode 137\nErrorMessage "rank 0 (host algo-1, local rank 0) '
                              'was killed by SIGKILL; not restarted (repeated: '), failure
    assert "earlier failures: attempt 0 failed (fault, restarted)" in failure, failure
    records = faults.read_restarts(base / "output" / "data")
    assert [(r.attempt, r.restarted) for r in records] == [(0, True), (1, False)]


def test_without_restarts_the_toolkits_launch_fails(tmp_path):
    """Control: max_restarts 0 leaves the request the SDK's; the toolkit's torchrun runs train.py, the
    killed rank fails the job and the failure file is the toolkit's."""
    base, request = _tree(tmp_path, _job(0, {FAULT_ENV: KILLED}))
    assert restart_loop.KEY not in request["HyperParameters"]
    proc = _train(base, request)
    output = proc.stdout[-4000:] + proc.stderr[-6000:]
    assert proc.returncode != 0, output
    failure = (base / "output" / "failure").read_text()
    assert failure.startswith("ExecuteUserScriptError:"), failure
    assert "torchrun --nnodes 1 --nproc_per_node 1 train.py" in failure, failure  # the toolkit's own command
    assert not (base / "output" / "data" / faults.RESTARTS_FILE).exists()
    assert "[smlaunch]" not in proc.stdout + proc.stderr  # no bootstrap of smlaunch's was involved


# A user's own script: fails by a signal in its first attempt, then checks that it sees what the SDK's
# request would have given it (its own name, its hyperparameters, nothing of the loop on its path).
SCRIPT = """
import json, os, signal, sys
if os.environ["SMLAUNCH_ATTEMPT"] == "0":
    os.kill(os.getpid(), signal.SIGKILL)
seen = {"entry_point": os.environ["SM_USER_ENTRY_POINT"], "hps": json.loads(os.environ["SM_HPS"]),
        "framework": json.loads(os.environ["SM_FRAMEWORK_PARAMS"]), "args": sys.argv[1:],
        "rank": os.environ["RANK"], "path": [p for p in sys.path if "_smlaunch" in p]}
with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w") as f:
    json.dump(seen, f)
"""


def test_a_users_script_is_restarted_and_sees_the_sdks_request(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "fit.py").write_text(SCRIPT)
    job = _job(2, {}, entry_point="fit.py", source_dir=str(code), hyperparameters={"epochs": 2}, **USER_IMAGE)
    base, request = _tree(tmp_path, job)
    proc = _train(base, request)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    seen = json.loads((base / "model" / "seen.json").read_text())
    assert seen == {"entry_point": "fit.py", "hps": {"epochs": 2}, "args": ["--epochs", "2"], "rank": "0",
                    "path": [], "framework": {"sagemaker_torch_distributed_enabled": True,
                                              "sagemaker_instance_type": INSTANCE}}
    [record] = faults.read_restarts(base / "output" / "data")
    assert record.restarted and record.failure_class == faults.FAULT


def test_the_loop_needs_only_what_it_ships(tmp_path):
    """A user script's archive holds the loop and what it imports, and they import with the standard
    library alone (`python -S`: no site-packages, so no installed smlaunch, pydantic or torch)."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "fit.py").write_text("print('hi')\n")
    job = _job(1, {}, entry_point="fit.py", source_dir=str(tmp_path / "code"), **USER_IMAGE)
    archive = build_job_sourcedir(job, tmp_path / "sourcedir.tar.gz").path
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    probe = ("import sys; sys.argv = ['_smlaunch/restart_loop.py']; sys.path.insert(0, '_smlaunch'); "
             "import container.toolkit.restart_loop as m; "
             "print(sorted({n.split('.')[0] for n in sys.modules if n.startswith(('container', 'launcher', 'pydantic', "
             "'torch'))}), m.__file__)")
    proc = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path / "x", capture_output=True, text=True,
                          check=False, env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    tops, where = proc.stdout.split("] ")
    assert tops + "]" == "['container', 'launcher']"
    assert Path(where.strip()).resolve().is_relative_to((tmp_path / "x" / "_smlaunch").resolve())
