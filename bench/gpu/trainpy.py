"""smlaunch's runtime, driven as a job drives it: `python entrypoints/train.py --key value ...` in
its own process (one rank, no torchrun), its figures read back from the metrics.jsonl it writes.

The step a job's records time is the trainer's own (container/loop.py: synchronize, the data,
forward, backward, clipping, the update, `loss.item()`, synchronize), so the per-step time here is
the difference of the cumulative `time_steps_s` + `time_data_s` of consecutive records (1 ms
resolution), and the peak memory is its `peak_memory_gib` (torch.cuda.max_memory_allocated).

Each run profiles its last step (`profile_steps`, container/profiling.py): the table of that
step's ops by device time comes back in the run's notes (`profile`: where the step's time goes),
and the step is left out of the timed ones (the profiler slows it). The same step's CUDA memory
snapshot (`memory_snapshot_steps`, container/memory_snapshots.py) is written too; its file and
size come back in the notes (the GPU check of a feature the CPU cannot run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from bench.gpu.measure import Outcome, tail
from bench.gpu.table import Run

ROOT = Path(__file__).resolve().parents[2]


def refusal(run: Run) -> str | None:
    """Why this runtime cannot take the run's hyperparameters (a name it does not know, a value it
    does not accept), or None. Checked with the runtime's own model, before a process starts."""
    from pydantic import ValidationError

    from launcher.config import TrainingHyperparameters

    unknown = [k for k in run.hyperparameters if k not in TrainingHyperparameters.model_fields]
    if unknown:
        return "unknown hyperparameter " + ", ".join(unknown)
    try:
        TrainingHyperparameters.model_validate(run.hyperparameters)
    except ValidationError as exc:
        bad = "; ".join(f"{'.'.join(map(str, e['loc']))}={run.hyperparameters.get(e['loc'][0])!r}: {e['msg']}"
                        for e in exc.errors())
        return f"hyperparameter not accepted by this runtime: {bad}"
    return None


def command(run: Run, out: Path) -> list[str]:
    args = [sys.executable, str(ROOT / "entrypoints" / "train.py")]
    for key, value in run.hyperparameters.items():
        args += [f"--{key}", str(value)]
    return args + ["--output_data_dir", str(out / "data"), "--model_dir", str(out / "model"),
                   "--checkpoint_dir", str(out / "checkpoints")]


def step_seconds(records: list[dict]) -> list[float]:
    """Each step's seconds from the cumulative ledger fields of consecutive records (logging_freq 1)."""
    totals = [r["time_steps_s"] + r["time_data_s"] for r in records if "time_steps_s" in r]
    return [b - a for a, b in zip([0.0, *totals], totals)]


def python_path() -> str:
    """PYTHONPATH with the repository's packages (a checkout, not installed, on the GPU machine) ahead
    of what it already names (the carried wheels), the repository once however often it is asked."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    return os.pathsep.join([str(ROOT), *rest])


def environment() -> dict:
    """A train.py run's environment: the repository's packages on the path, output unbuffered."""
    return {**os.environ, "PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1"}


def profiled(run: Run) -> Run:
    """The run with its last step profiled and its memory snapshot taken."""
    return replace(run, hyperparameters={**run.hyperparameters, "profile_steps": str(run.steps),
                                         "memory_snapshot_steps": str(run.steps)})


def snapshot_note(data: Path) -> str:
    """The memory snapshot's file and size, or that it is missing."""
    found = sorted((data / "memory").glob("rank-0-*.pickle"))
    return ", ".join(f"{p.name} {p.stat().st_size:,} B" for p in found) or "missing: no rank-0 snapshot written"


def run_trainpy(run: Run, timeout_s: float | None, scratch: Path) -> Outcome:
    reason = refusal(run)
    if reason:
        return Outcome.skipped(reason)
    run = profiled(run)
    # the exported model (2.5 GB for 1B) goes where it costs least and is deleted with the run
    with tempfile.TemporaryDirectory(dir=scratch, prefix=f"{run.name}-") as tmp:
        out = Path(tmp)
        try:
            done = subprocess.run(command(run, out), capture_output=True, text=True, timeout=timeout_s,
                                  cwd=ROOT, env=environment())
        except subprocess.TimeoutExpired as exc:
            return Outcome.failed(f"timed out after {timeout_s:.0f} s", tail(exc.stdout, exc.stderr))
        metrics = out / "data" / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        table = out / "data" / "profile" / "rank-0.txt"
        profile = table.read_text() if table.is_file() else None
        snapshot = snapshot_note(out / "data")
    records = [r for r in records if "loss" in r]
    if done.returncode != 0 or not records:
        return Outcome.failed(f"train.py exited {done.returncode}", tail(done.stdout, done.stderr))
    return Outcome(status="ok", step_s=step_seconds(records)[:-1], losses=[r["loss"] for r in records],
                   peak_memory_gib=records[-1]["peak_memory_gib"],
                   notes={"profile": profile, "profiled_step": run.steps, "step_s": "without the profiled step",
                          "memory_snapshot": snapshot})
