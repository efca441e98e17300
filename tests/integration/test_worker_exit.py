"""An xdist worker's quick exit (tests/support/worker_exit.py): what the process registered with
atexit still runs (a weakref.finalize's cleanup among it) and its output is flushed, but the
interpreter's teardown, which frees every object, does not run; the control: outside a worker the
plugin does nothing and the teardown runs. A fresh interpreter each, ~0.3 s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROCESS = """
import atexit, sys, weakref
from pathlib import Path
from tests.support import worker_exit

out = Path(sys.argv[1])


class Global:
    def __del__(self):  # runs in the interpreter's teardown, as it clears this module
        (out / "teardown").write_text("freed")


kept = Global()
atexit.register((out / "atexit").write_text, "ran")
weakref.finalize(kept, (out / "finalize").write_text, "ran")  # at exit, as a TemporaryDirectory's
worker_exit.pytest_unconfigure(None)
sys.stdout.write("unflushed")
"""


@pytest.mark.parametrize("worker", ["gw0", None])
def test_a_worker_runs_its_atexit_functions_and_skips_the_teardown(tmp_path, worker):
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    if worker:
        env["PYTEST_XDIST_WORKER"] = worker
    done = subprocess.run([sys.executable, "-c", PROCESS, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "unflushed"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "finalize").read_text() == "ran"
    assert (tmp_path / "teardown").exists() == (worker is None)
