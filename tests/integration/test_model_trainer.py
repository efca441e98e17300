"""`launcher.ModelTrainer`: a SageMaker SDK v3 script, its import changed, validated by smlaunch's
rules with errors in v3 terms, planned, dry-run, and run in local mode.

The request it sends is compared with the official SDK v3's in tests/integration/test_model_trainer_parity.py.
Here the tests that start processes; the rest are tests/unit/test_model_trainer.py."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from launcher.sdk.model_trainer import (
    Compute,
    InputData,
    Mode,
    ModelTrainer,
    SourceCode,
)
from launcher.wire.training.issues import ConfigError
from tests.support.model_trainer import ROOT

pytestmark = pytest.mark.usefixtures("no_network", "fake_credentials")  # nothing here reaches AWS or the network


# --- local mode ---------------------------------------------------------------------------------------
def test_local_train_runs_the_script_with_its_channel(tmp_path, monkeypatch):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    code, data = tmp_path / "src", tmp_path / "data"
    code.mkdir()
    data.mkdir()
    (data / "part-0.txt").write_text("x\n")
    (code / "job.py").write_text(
        "import os, sys\n"
        "seen = sorted(os.listdir(os.environ['SM_CHANNEL_TRAIN']))\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'run.txt'), 'w').write(' '.join(sys.argv[1:] + seen))\n")
    trainer = ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, compute=Compute(instance_type="local_cpu"),
                           source_code=SourceCode(source_dir=str(code), entry_script="job.py"),
                           hyperparameters={"epochs": 2}, base_job_name="v3-local")
    shown = trainer.dryrun([InputData(channel_name="train", data_source=str(data))])["LocalJob"]
    assert shown["Channels"] == {"train": str(data)} and not (tmp_path / "home").exists()  # nothing written
    with pytest.raises(ConfigError, match="input_data_config"):  # a dry run checks the new channels too
        trainer.train(input_data_config=[InputData(channel_name="train", data_source=str(tmp_path / "no"))],
                      dry_run=True)
    trainer.train(input_data_config=[InputData(channel_name="train", data_source=str(data))])
    assert trainer.latest_training_job.name.startswith("v3-local-")
    model = Path(trainer.estimator.model_data)
    with tarfile.open(model) as tar:
        assert tar.extractfile("run.txt").read() == b"--epochs 2 part-0.txt"


def test_importing_it_loads_neither_torch_nor_boto3():
    code = ("import sys, launcher; import launcher.sdk.model_trainer as m; "
            "print(launcher.ModelTrainer is m.ModelTrainer, 'torch' in sys.modules, 'boto3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["True", "False", "False"]
