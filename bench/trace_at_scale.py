"""The planner against the runtime's own trace at the seeds' real world sizes (issue 51, section 3).

Each case is `smlaunch plan SEED --set ... --trace --json` as a user runs it: the trace of rank 0
(python -m container trace: the job's whole world on a fake process group, one step on fake
tensors) beside the planner's figures for the same rank. Prints a Markdown table of parameters,
optimizer state and the step's peak, traced against planned, with the difference, for
BENCHMARKS.md:

    .venv/bin/python bench/trace_at_scale.py [--only LABEL,...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "configs" / "seed"
GIB = 2**30

# the p5 seed's job with Mixtral 8x7B: experts split over the host's 8 GPUs, the rest FSDP-sharded
MIXTRAL = ["hyperparameters.hf_pretrained_model_name_or_dir=mistralai/Mixtral-8x7B-v0.1",
           "hyperparameters.model_type=mixtral", "hyperparameters.vocab_size=32000",
           "hyperparameters.max_context_width=8192", "hyperparameters.train_batch_size=1",
           "context_parallel_degree=1", "hybrid_shard_degree=8", "expert_parallel_degree=8"]
# the p5 seed's job in 2 pipeline stages of 4 cp ranks, as pipelining takes it: random weights
# initialised on every rank, no validation
PIPELINE = ["pipeline_parallel_degree=2", "context_parallel_degree=4", "hybrid_shard_degree=4", "microbatches=4",
            "hyperparameters.delayed_param=0", "delayed_parameter_initialization=false",
            "hyperparameters.init_from_scratch=1", "hyperparameters.validation_freq=null"]
# (label, seed file, --set overrides): the seeds as written (1 host of 8 GPUs) and at fleet sizes
CASES = [
    ("seed p4d cp 8", "p4d-cp8.yaml", []),
    ("seed p4d no cp", "p4d-no-cp.yaml", []),
    ("seed p5 cp 8 bf16", "p5-cp8-bf16.yaml", []),
    ("seed p5 cp 8 bf16, 16 hosts", "p5-cp8-bf16.yaml", ["instance_count=16"]),
    ("seed p5 tp 2 cp 4, 4 hosts", "p5-cp8-bf16.yaml",
     ["instance_count=4", "tensor_parallel_degree=2", "context_parallel_degree=4"]),
    ("seed p5 cp 8 fp8", "p5-cp8-fp8.yaml", []),
    ("seed p5 with Mixtral 8x7B: ep 8 at 8K batch 1", "p5-cp8-bf16.yaml", MIXTRAL),
    ("the same without activation checkpointing", "p5-cp8-bf16.yaml",
     MIXTRAL + ["hyperparameters.activation_checkpointing=0"]),
    ("seed p5 pp 2 x cp 4: microbatches 4", "p5-cp8-bf16.yaml", PIPELINE),
]


def run_case(seed: str, overrides: list[str]) -> tuple[dict, float]:
    args = [sys.executable, "-m", "launcher.cli", "plan", str(SEED / seed), "--trace", "--json"]
    for item in overrides:
        args += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=False)
    seconds = time.perf_counter() - started
    try:
        (row,) = json.loads(proc.stdout)
    except (ValueError, TypeError):
        return {"failed": (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")[-300:]}, seconds
    return row, seconds


def _pair(traced: int, planned: int) -> str:
    diff = (planned - traced) / traced * 100 if traced else float("nan")
    return f"{traced / GIB:.2f} / {planned / GIB:.2f} ({diff:+.1f}%)"


def table_row(label: str, row: dict, seconds: float) -> str:
    if "failed" in row:
        return f"| {label} | failed: {row['failed']} | | | | |"
    trace = row.get("trace", {})
    if "not_traced" in trace:
        return f"| {label} | {trace.get('world_size', '')} | not traced: {trace['not_traced']} | | | {seconds:.0f} s |"
    rank = trace["ranks"][0]
    planned = rank["planned"]
    return (f"| {label} | {trace['world_size']} | {_pair(rank['parameter_bytes'], planned['parameter_bytes'])} | "
            f"{_pair(rank['optimizer_bytes'], planned['optimizer_bytes'])} | "
            f"{_pair(rank['peak_bytes'], planned['peak_bytes'])} | {seconds:.0f} s |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated labels (default: every case)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.only is None or c[0] in args.only.split(",")]
    print("| job | ranks | parameters GiB, traced / planned | optimizer state GiB | step peak GiB | "
          "plan --trace wall |")
    print("|---|---|---|---|---|---|")
    for label, seed, overrides in cases:
        row, seconds = run_case(seed, overrides)
        print(table_row(label, row, seconds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
