"""Unit tests start no process and open no socket (docs/architecture.md, "Tests"): each test runs
with both refused, so a test that needs either fails here, naming tests/integration as its place."""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess

import pytest

# urllib3 (under boto3) binds a socket to ::1 when first imported, to learn whether IPv6 works: that
# is the library's import, not a test's socket, and where a unit module is the first to import boto3
# in its process (alone, or on an xdist worker) the guard refused it. So it is imported here.
import urllib3  # noqa: F401

try:  # matplotlib lists the system's fonts with `fc-list` (a process) when it first builds its font
    # cache: on a fresh machine that was the first unit test to plot, refused (test_metrics_cli)
    import matplotlib.font_manager  # noqa: F401
except ImportError:  # the plot extra is not installed: the tests that plot skip
    pass


class NotAUnitTest(BaseException):
    """BaseException, so that code under test which catches Exception cannot swallow it."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise NotAUnitTest(f"a unit test {what}; a test that needs it belongs in tests/integration")

    return refuse


@pytest.fixture(autouse=True)
def _no_process_no_socket(monkeypatch):
    for owner, name in ((subprocess.Popen, "__init__"), (os, "fork"), (os, "posix_spawn"), (os, "system"),
                        (multiprocessing.process.BaseProcess, "start")):
        monkeypatch.setattr(owner, name, _refuse("started a process"))
    for name in ("connect", "bind"):
        monkeypatch.setattr(socket.socket, name, _refuse("opened a socket"))


# A traced rank (container.trace.step.trace_rank) makes the test's process a rank of its fake world:
# the variables go back as they were after each test, so that no later test of the worker starts a
# program (train.py) that takes them for its own (test_trace_pipeline left WORLD_SIZE=2 without
# MASTER_ADDR, and test_step_allocs' bench then failed its rendezvous in the same worker).
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _rank_environment_restored():
    before = {name: os.environ.get(name) for name in _RANK_VARIABLES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
