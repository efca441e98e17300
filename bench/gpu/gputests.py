"""The tests CI skips for want of a GPU (`pytest -m gpu`: every test that needs CUDA carries the
`gpu` mark), run on the device with a JUnit XML report, each test's outcome read from it."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.gpu.measure import tail

ROOT = Path(__file__).resolve().parents[2]


def gpu_test_files() -> list[str]:
    """The test modules that mark a test `gpu`. Only these are collected: the GPU machine lacks what
    other modules import (boto3, moto, the SageMaker SDKs), and collecting them would fail the run."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text())


def command(junit: Path, dry_run: bool) -> list[str]:
    # -n 0: one process (the tests that train start their own ranks); -p no:cacheprovider: nothing
    # written into the tree. The dry run collects only: on a CPU every gpu test would skip anyway.
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-p", "no:cacheprovider", "-q", "-rA",
           f"--junitxml={junit}", *gpu_test_files()]
    return cmd + (["--collect-only"] if dry_run else [])


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed, failed, error or skipped (with the reason)."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        found[name] = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                found[name] = child.tag if child.tag == "error" else "failed"
            elif child.tag == "skipped":
                found[name] = f"skipped: {child.get('message', '')}"
    return found


def run_tests(timeout_s: float | None, scratch: Path, dry_run: bool) -> dict:
    junit = scratch / "gpu-tests.xml"
    try:
        done = subprocess.run(command(junit, dry_run), capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        return {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s",
                "output_tail": tail(exc.stdout, exc.stderr)}
    collected = [line.strip() for line in done.stdout.splitlines() if "::" in line] if dry_run else []
    results = outcomes(junit) if junit.is_file() and not dry_run else {}
    # pytest: 0 all passed, 1 some failed, 5 none collected; anything else is the run's own failure
    status = "ok" if done.returncode in (0, 1) else "failed"
    return {"status": status, "exit_code": done.returncode, "tests": results, "collected": collected,
            "counts": {k: sum(v.startswith(k) for v in results.values()) for k in ("passed", "failed", "error",
                                                                                   "skipped")},
            "output_tail": tail(done.stdout[-2000:], done.stderr[-1000:]) if status != "ok" or results else None}
