"""Planner calibration: throughput predicted against published runs (issue 15, no GPU needed),
then predicted against measured peak GPU memory on one GPU (issue 6).

Throughput: every run of `launcher.plan.throughput.CALIBRATION` (the seed's p5 runs,
torchtitan's H100 and A100 runs) is planned with the fitted model (one η per accelerator
generation and dtype plus the communication model, docs/planner.md) and printed beside its
published tokens/s per GPU, with the step's compute and exposed communication, as a Markdown
table for BENCHMARKS.md.

Memory:

For a ~1B preset (llama3.2-1b) at sequence 4096, 8192 and 16384, with and without (full)
activation checkpointing, the real runtime trains a few steps exactly as entrypoints/train.py
does (container.distributed.runtime + container.trainer: FSDP2 on a one-GPU mesh, bf16 compute with fp32
master weights, delayed init, AdamW, synthetic data, batch 1). Measured, after the last step:

- torch.cuda.max_memory_allocated: the peak of live tensors, against the planner's
  `allocated_gib` (the largest phase total of launcher.plan.memory);
- torch.cuda.max_memory_reserved: what the caching allocator held, against allocated x
  (1 + ALLOCATOR_RESERVE).

Every configuration runs in its own process (this script with --worker), so an OOM or one
configuration's allocator state cannot touch the next; an OOM is recorded as such, to compare
with the planner's `fits`. The predicted job names the catalog instance of the GPU found (an
H100 is ml.p5.4xlarge) with processes_per_host 1. Prints a table, a Markdown table for
BENCHMARKS.md, and JSON (also to --json FILE). Without CUDA it says so and exits 0.

Run: `.venv/bin/python bench/plan_calibration.py [--preset llama3.2-1b] [--seqs 4096 8192 16384]
[--steps 3] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30

# CUDA device name -> the catalog instance type whose accelerator it is (most specific first)
_INSTANCES = (("H200", "ml.p5en.48xlarge"), ("H100", "ml.p5.4xlarge"), ("A100-SXM4-80GB", "ml.p4de.24xlarge"),
              ("A100 80GB", "ml.p4de.24xlarge"), ("A100", "ml.p4d.24xlarge"), ("L40S", "ml.g6e.xlarge"),
              ("L4", "ml.g6.xlarge"), ("A10G", "ml.g5.xlarge"), ("B200", "ml.p6-b200.48xlarge"))


def hyperparameters(preset: str, seq: int, ac: bool, steps: int) -> dict:
    return {"model_preset": preset, "dataset_type": "synthetic", "max_context_width": seq, "train_batch_size": 1,
            "max_steps": steps, "logging_freq": steps, "bf16": 1, "delayed_param": 1,
            "activation_checkpointing": int(ac)}


def predict(preset: str, seq: int, ac: bool, steps: int, instance_type: str):
    from launcher.config import validate_job
    from launcher.plan import estimate_memory

    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                        "instance_type": instance_type, "processes_per_host": 1,
                        "hyperparameters": hyperparameters(preset, seq, ac, steps)})
    return estimate_memory(job, advise=False)


def worker(preset: str, seq: int, ac: bool, steps: int) -> dict:
    """Train in this process as train.py does; the peak memory figures, or the OOM message."""
    from container.args import parse_args
    from container.distributed.runtime import distribution_parameters, init_runtime, shutdown
    from container.trainer import train

    with tempfile.TemporaryDirectory() as tmp:
        argv = [item for k, v in hyperparameters(preset, seq, ac, steps).items() for item in (f"--{k}", str(v))]
        argv += ["--output_data_dir", tmp, "--model_dir", f"{tmp}/model", "--checkpoint_dir", f"{tmp}/ckpt"]
        hp, dirs, pairs = parse_args(argv)
        rt = init_runtime(distribution_parameters(pairs.get("mp_parameters")))
        try:
            last = train(rt, hp, dirs)
            return {"allocated_gib": torch.cuda.max_memory_allocated() / GIB,
                    "reserved_gib": torch.cuda.max_memory_reserved() / GIB,
                    "tokens_per_s_per_gpu": last.get("tokens_per_s_per_gpu")}
        except torch.cuda.OutOfMemoryError as exc:
            return {"oom": str(exc).splitlines()[0]}
        finally:
            shutdown()


def measure(preset: str, seq: int, ac: bool, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--preset", preset, "--seqs", str(seq), "--steps", str(steps)]
    cmd += ["--ac"] if ac else []
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def instance_for(device_name: str) -> str:
    return next((inst for key, inst in _INSTANCES if key in device_name), "ml.p5.4xlarge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama3.2-1b")
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ac", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.preset, args.seqs[0], args.ac, args.steps)))
        return
    throughput_table()
    if not torch.cuda.is_available():
        print("\nThe memory calibration needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured.")
        return
    from launcher.plan.memory import ALLOCATOR_RESERVE

    device = torch.cuda.get_device_name()
    instance = instance_for(device)
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    print(f"machine: {platform.node()}, {device} ({total:.1f} GiB visible), torch {torch.__version__}; "
          f"{args.preset}, batch 1, {args.steps} steps; predicted as {instance} with 1 process")
    rows = []
    for seq in args.seqs:
        for ac in (False, True):
            est = predict(args.preset, seq, ac, args.steps, instance)
            got = measure(args.preset, seq, ac, args.steps)
            row = {"seq": seq, "activation_checkpointing": ac, "predicted_allocated_gib": round(est.allocated_gib, 3),
                   "predicted_peak_gib": round(est.peak_gib, 3), "predicted_phase": est.peak_phase,
                   "predicted_fits": est.fits,
                   **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in got.items()}}
            if "allocated_gib" in got:
                row["allocated_error"] = round(est.allocated_gib / got["allocated_gib"] - 1, 4)
                row["reserved_error"] = round(est.allocated_gib * (1 + ALLOCATOR_RESERVE) / got["reserved_gib"] - 1, 4)
            rows.append(row)
            _print_row(row)
    errors = [abs(r["allocated_error"]) for r in rows if "allocated_error" in r]
    if errors:
        print(f"allocated: mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%} over {len(errors)} runs")
    print("\nMarkdown for BENCHMARKS.md:\n")
    print("| seq | AC | predicted GiB (phase) | max_memory_allocated GiB | error | predicted x reserve | "
          "max_memory_reserved GiB | error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ac = "full" if r["activation_checkpointing"] else "off"
        if "allocated_gib" in r:
            print(f"| {r['seq']} | {ac} | {r['predicted_allocated_gib']:.2f} ({r['predicted_phase']}) | "
                  f"{r['allocated_gib']:.2f} | {r['allocated_error']:+.1%} | "
                  f"{r['predicted_allocated_gib'] * (1 + ALLOCATOR_RESERVE):.2f} | {r['reserved_gib']:.2f} | "
                  f"{r['reserved_error']:+.1%} |")
        else:
            what = "OOM" if "oom" in r else "error"
            print(f"| {r['seq']} | {ac} | {r['predicted_allocated_gib']:.2f} ({r['predicted_phase']}; fits "
                  f"{r['predicted_fits']}) | {what} | | | | |")
    report = {"device": device, "instance_type": instance, "preset": args.preset, "steps": args.steps, "rows": rows}
    print("\n" + json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def throughput_table() -> None:
    """Predicted against published tokens/s per GPU for every calibration and cross-check run."""
    from launcher.plan.throughput import CALIBRATION, estimate_workload

    print("Throughput: predicted against published (η fitted per generation and dtype, docs/planner.md)\n")
    print("| run | GPUs | seq | cp | AC | published tokens/s/GPU | predicted | error | compute s | "
          "exposed comm s | η | fitted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in CALIBRATION:
        w = p.workload()
        est = estimate_workload(w)
        error = est.tokens_per_s_per_gpu / p.tokens_per_s_per_gpu - 1
        print(f"| {p.label} ({p.dtype}) | {w.world} | {p.seq_len} | {p.cp} | {p.ac_mode} | "
              f"{p.tokens_per_s_per_gpu:,.0f} | {est.tokens_per_s_per_gpu:,.0f} | {error:+.1%} | "
              f"{est.compute_s:.3f} | {est.communication_s:.3f} | {est.efficiency:.3f} | "
              f"{'yes' if p.fitted else 'no'} |")


def _print_row(r: dict) -> None:
    ac = "AC full" if r["activation_checkpointing"] else "AC off "
    head = f"seq {r['seq']:>6} {ac}: predicted {r['predicted_allocated_gib']:7.2f} GiB ({r['predicted_phase']})"
    if "allocated_gib" in r:
        print(f"{head}, measured {r['allocated_gib']:7.2f} GiB allocated ({r['allocated_error']:+.1%}), "
              f"{r['reserved_gib']:7.2f} GiB reserved ({r['reserved_error']:+.1%})")
    else:
        print(f"{head}, predicted fits {r['predicted_fits']}: {r.get('oom') or r.get('error')}")


if __name__ == "__main__":
    main()
