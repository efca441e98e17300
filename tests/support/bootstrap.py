"""What the unit and integration tests of bootstrap share (tests/{unit,integration}/test_bootstrap.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from launcher.wire.hyperparameters import encode
from launcher.wire.opt_ml import write_opt_ml

REPO = Path(__file__).resolve().parents[2]


def host_tree(tmp_path: Path, host: str, hosts: list[str], hps: dict,
              instance_type: str = "local") -> Path:
    base = tmp_path / host / "opt" / "ml"
    write_opt_ml(base, hyperparameters=encode(hps), current_host=host, hosts=hosts,
                 instance_type=instance_type, channels={})
    return base


def distributed(program: str, src: Path, **extra) -> dict:
    return {"sagemaker_program": program, "sagemaker_submit_directory": str(src),
            "sagemaker_torch_distributed_enabled": True, "sagemaker_smlaunch_processes_per_host": 2,
            **extra}


def bootstrap_env(base: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SMLAUNCH_"))}
    env.pop("SAGEMAKER_PROGRAM", None)
    # TMPDIR: what a SIGKILLed bootstrap cannot clean up stays in the test's directory
    env.update({"SAGEMAKER_BASE_DIR": str(base), "PYTHONPATH": str(REPO), "TMPDIR": str(base.parent), **extra})
    return env


def start(base: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "container", "train"], cwd=REPO,
                            env=bootstrap_env(base, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run(base: Path, timeout: float = 60, **extra: str) -> tuple[int, str]:
    proc = start(base, **extra)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


CHECK_CODE = """
import os, helper
with open(os.path.join(os.environ["SM_MODEL_DIR"], "ok.txt"), "w") as f:
    f.write(helper.VALUE + " " + os.getcwd())
"""


def tarball(tmp_path: Path) -> Path:
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in (("train.py", CHECK_CODE), ("helper.py", "VALUE = 'from-tarball'\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return archive
