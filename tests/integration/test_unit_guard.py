"""The unit folder's guard (tests/unit/conftest.py) refuses a process and a socket: a test file that
starts one, run under that conftest, fails with the guard's message (a plain test beside passes)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """import socket
import subprocess


def test_process():
    subprocess.run(["true"])


def test_socket():
    socket.socket().connect(("127.0.0.1", 9))


def test_plain():
    assert 1 + 1 == 2
"""


def test_a_unit_test_that_starts_a_process_or_opens_a_socket_fails(tmp_path):
    shutil.copy(ROOT / "tests" / "unit" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "2 failed, 1 passed" in out.stdout, out.stdout[-2000:]
    assert "started a process" in out.stdout and "opened a socket" in out.stdout
