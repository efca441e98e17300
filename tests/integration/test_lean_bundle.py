"""A lean code bundle, as jobs run it (issue 30): a user script's own `container` and `launcher`
packages are the ones it imports, and smlaunch's runtime, shipped under `_smlaunch/`, trains from
its bundle where no smlaunch is installed (AWS's images). Here the tests that start processes; the
rest are tests/unit/test_lean_bundle.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from launcher.config import validate_job
from tests.support.own_scripts import job_name, script_job, submit
from tests.support.train_runs import ROOT

USES_OWN_PACKAGES = """
import json, os, container, launcher
print("container is", container.WHO, "; launcher is", launcher.WHO, flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"container": container.__file__, "launcher": launcher.__file__}, f)
"""


def test_a_user_scripts_own_container_and_launcher_packages_are_the_ones_it_imports(tmp_path, home):
    job = script_job(tmp_path, USES_OWN_PACKAGES, None)
    src = tmp_path / "job-src"
    for package in ("container", "launcher"):
        (src / package).mkdir()
        (src / package / "__init__.py").write_text(f"WHO = 'the user\\'s {package}'\n")
    proc = submit(Path(sys.executable), job, home)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "sourcedir.tar.gz: 3 files, " in proc.stdout and "nothing of smlaunch (a user script" in proc.stdout
    assert proc.stdout.count("container is the user's container ; launcher is the user's launcher") == 2
    name = job_name(proc)
    with tarfile.open(home / "jobs" / name / "sourcedir.tar.gz") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == [
            "container/__init__.py", "job.py", "launcher/__init__.py"]
    for host, rank in (("algo-1", 0), ("algo-2", 1)):
        seen = json.loads((home / "jobs" / name / "hosts" / host / "model" / f"rank-{rank}.json").read_text())
        code = home / "jobs" / name / "hosts" / host / "code"
        assert seen == {"container": str(code / "container" / "__init__.py"),
                        "launcher": str(code / "launcher" / "__init__.py")}


# Stands in for an image without smlaunch (AWS's DLC, whose toolkit runs `train.py` in the code
# directory): nothing of smlaunch can be imported but what the bundle brings.
NO_SMLAUNCH = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if "site-packages" in p or not p.startswith(sys.argv[1])]
try:
    import container
except ImportError:
    print("no smlaunch here", flush=True)
else:
    raise SystemExit(f"smlaunch is importable from {container.__file__}")
sys.argv = ["train.py", *sys.argv[2:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_the_runtime_trains_from_its_bundle_where_no_smlaunch_is_installed(tmp_path):
    hps = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 32, "max_steps": 1}
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type":
                        "ml.g5.xlarge", "hyperparameters": hps})
    from launcher.backends.sourcedir import build_job_sourcedir

    bundle = build_job_sourcedir(job, tmp_path / "sourcedir.tar.gz")
    code = tmp_path / "code"
    with tarfile.open(bundle.path) as tar:
        tar.extractall(code, filter="data")
    model = tmp_path / "model"
    model.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SMLAUNCH_", "PYTHONPATH"))}
    env.update(SM_MODEL_DIR=str(model), SM_OUTPUT_DATA_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    args = [f"--{k}={v}" for k, v in hps.items()]
    repos = os.path.commonpath([str(ROOT), str(Path(__file__).resolve())])
    proc = subprocess.run([sys.executable, "-c", NO_SMLAUNCH, repos, *args], cwd=code, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("no smlaunch here") and "[metrics] step=1 loss=" in proc.stdout
    assert (model / "model.safetensors").is_file()
