"""Runs a peer's worker (bench/gpu/hf_loop.py, bench/gpu/titan_run.py) in its own process and reads
the `RESULT <json>` line it ends with: a fresh process per run, so one run's memory, compiled
graphs or a crash never reach the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.gpu.measure import Outcome, tail
from bench.gpu.table import Run

ROOT = Path(__file__).resolve().parents[2]
RESULT = "RESULT "


def run_worker(module: str, run: Run, timeout_s: float | None, env: dict | None = None) -> Outcome:
    cmd = [sys.executable, "-m", module, json.dumps({**run.hyperparameters, "name": run.name})]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    except subprocess.TimeoutExpired as exc:
        return Outcome.failed(f"timed out after {timeout_s:.0f} s", tail(exc.stdout, exc.stderr))
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        return Outcome.failed(f"{module} exited {done.returncode}", tail(done.stdout, done.stderr))
    result = json.loads(lines[-1][len(RESULT):])
    if result.get("skipped"):
        return Outcome.skipped(result["skipped"])
    return Outcome(status="ok", step_s=result["step_s"], losses=result["losses"],
                   peak_memory_gib=result.get("peak_memory_gib"), notes=result.get("notes", {}))


def run_hf(run: Run, timeout_s: float | None, scratch: Path) -> Outcome:
    return run_worker("bench.gpu.hf_loop", run, timeout_s)
