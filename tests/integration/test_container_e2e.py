"""The container path end to end: two simulated hosts, each with its own /opt/ml tree, run the
bootstrap, which starts train.py under torchrun with the job's hyperparameters as SageMaker sends
them. The hosts train exactly like one process on the same data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from launcher.wire.hyperparameters import encode
from launcher.wire.opt_ml import free_port, write_opt_ml
from tests.support.train_runs import ROOT, run_train, series

HP = {"model_preset": "llama3-tiny", "dataset_type": "jsonl", "max_context_width": 64, "max_steps": 4,
      "lr": 0.03, "warmup": 0.0, "min_lr": 0.003, "seed": 7, "logging_freq": 1}


def test_two_hosts_through_the_bootstrap_match_one_process(tmp_path, corpus):
    train, validation = corpus
    hosts = ["algo-1", "algo-2"]
    hps = {**HP, "train_batch_size": 2, "checkpoint_freq": 2, "validation_freq": 2, "validation_batches": 2,
           "mp_parameters": {"hybrid_shard_degree": 1},  # replicate over the two hosts
           "sagemaker_program": "train.py", "sagemaker_submit_directory": str(ROOT / "entrypoints"),
           "sagemaker_torch_distributed_enabled": True, "sagemaker_smlaunch_processes_per_host": 1}
    port = str(free_port())
    procs, bases = [], []
    for host in hosts:
        base = tmp_path / host
        write_opt_ml(base, hyperparameters=encode(hps), current_host=host, hosts=hosts, instance_type="local",
                     channels={"train": train, "validation": validation})
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SMLAUNCH_"))}
        env.update(SAGEMAKER_BASE_DIR=str(base), SMLAUNCH_MASTER_ADDR="127.0.0.1", SMLAUNCH_MASTER_PORT=port,
                   OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        # each host's output to a file: read one after the other, the second host's pipe could fill
        # while the first waits on it in a collective
        with open(tmp_path / f"{host}.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "container", "train"], cwd=base, env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
        bases.append(base)
    for p in procs:
        p.wait(timeout=240)
    outputs = [(tmp_path / f"{host}.log").read_text(errors="replace") for host in hosts]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert all((b / "output" / "success").exists() for b in bases)

    records = [json.loads(line) for line in (bases[0] / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [2, 4]
    # the line SageMaker's MetricDefinitions read, as train.py printed it (no torchrun prefix)
    assert re.search(r"^\[metrics\] step=4 loss=", outputs[0], re.MULTILINE), outputs[0][-3000:]
    assert (bases[0] / "model" / "model.safetensors").is_file() and (bases[0] / "model" / "config.json").is_file()
    # Each host keeps its own shards on its own disk, as on SageMaker, where every host's
    # /opt/ml/checkpoints syncs to one S3 prefix: the marker is rank 0's, on the first host.
    for rank, base in enumerate(bases):
        assert sorted(p.name for p in (base / "checkpoints").iterdir()) == ["step-2", "step-4"], base
        assert (base / "checkpoints" / "step-4" / f"__{rank}_0.distcp").is_file()
    assert (bases[0] / "checkpoints" / "step-4" / ".complete").is_file()

    reference = run_train(tmp_path / "ref", 1, **{**HP, "train_batch_size": 4}, training_dir=str(train))
    assert series(records, "loss") == pytest.approx(series(reference, "loss"), rel=1e-5)
