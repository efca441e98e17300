"""An xdist worker leaves without tearing its interpreter down.

At its end a worker holds ~1.5M objects (torch, transformers, the SDKs, moto, every test module and
what the tests cached), and Python's finalization freed them one by one while the controller waited
for every worker's process to end before its summary: 2-3 s after tests/unit's last test, ~5 s
after a whole suite's, with the cores busy (BENCHMARKS.md). What a process must still do as it
leaves is in its atexit functions (multiprocessing's, which ends its children; weakref.finalize's,
which removes temporary directories; filelock's): they run, then the worker exits at once. It is
registered last, so it runs first; the worker has sent its results and ended its session by then.
A worker always leaves with status 0 this way: a worker that failed did so before (xdist reports a
worker that went down from its channel, not from its status)."""

from __future__ import annotations

import atexit
import os
import sys

import pytest


def pytest_unconfigure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        atexit.register(_leave_now)


def _leave_now() -> None:
    atexit.unregister(_leave_now)
    atexit._run_exitfuncs()  # the others, in their order (last registered first)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
