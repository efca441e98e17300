"""LoRA's and QLoRA's training step against a full fine-tune of the same model, on CPU, beside the planner.

One job per case, the same model, batch and data (synthetic tokens) in each: a full fine-tune, LoRA
(all-linear, r 16, alpha 32, dropout 0.05: peft's and TRL's defaults but the targets) and QLoRA (the
same adapters on an NF4 base, `load_in_4bit`). Each case is measured three ways:

- run: `entrypoints/train.py` on one process (fp32, no FSDP at world 1), a fresh interpreter per
  case; each step's seconds from its metrics.jsonl (`time_steps_s`, differenced; the first two
  steps are warm-up, left out as train.py's throughput leaves them), and the process's peak
  resident set (the record's peak_memory_gib: ru_maxrss on CPU; for QLoRA that is the eager
  init's whole fp32 model, before quantization: docs/lora.md);
- trace: `smlaunch plan --trace`'s code (launcher.plan.trace): the runtime's own step on fake
  tensors, torch's memory tracker's peak of live tensors and what the rank holds after it
  (parameters, gradients, optimizer state: container.holdings);
- plan: the planner's figures for the same job (launcher.plan.trace.planned_figures: the held
  terms and the largest step phase's live tensors, without allocator reserve or CUDA context).

Trainable parameters as validate counts them (launcher.wire.training.lora.trainable_parameters; a
full fine-tune trains every parameter). The planner plans the job as on one H100 (ml.p5.48xlarge,
1 process); a CPU run holds what a GPU's allocator would, so live tensors compare, not the reserve.

Run: `.venv/bin/python bench/lora_step.py [--layers 4] [--vocab 32000] [--seq 128] [--steps 10]
[--cases full lora qlora]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
P5 = "ml.p5.48xlarge"
WARMUP = 2  # container.metrics.Throughput leaves a run's first two steps out
CASES = {
    "full": {},
    "lora": {"use_peft": 1, "lora_target_modules": "all-linear"},
    "qlora": {"use_peft": 1, "lora_target_modules": "all-linear", "load_in_4bit": 1},
}


def hyperparameters(case: str, opts: argparse.Namespace) -> dict:
    return {"model_preset": opts.preset, "num_layers": opts.layers, "vocab_size": opts.vocab,
            "dataset_type": "synthetic", "max_context_width": opts.seq, "train_batch_size": opts.batch,
            "max_steps": opts.steps, "logging_freq": 1, "bf16": 0, "seed": 0, **CASES[case]}


def validated(hp: dict):
    from launcher.config import validate_job

    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": P5,
           "processes_per_host": 1, "hyperparameters": hp}
    return validate_job(job, base_dir=ROOT)


def run(hp: dict) -> dict:
    """train.py on one process: the timed steps' seconds and the process's peak resident set."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [arg for key, value in hp.items() for arg in (f"--{key}", str(value))]
        cmd = [sys.executable, str(ROOT / "entrypoints" / "train.py"), *argv, "--output_data_dir", tmp,
               "--model_dir", f"{tmp}/model", "--checkpoint_dir", f"{tmp}/ckpt"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"train.py failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        records = [json.loads(line) for line in Path(tmp, "metrics.jsonl").read_text().splitlines()]
    cumulative = [r["time_steps_s"] for r in records]  # the steps' own seconds so far (no data, no checkpoint)
    steps = [b - a for a, b in zip([0.0, *cumulative], cumulative)][WARMUP:]
    return {"step_s": steps, "rss_gib": max(r["peak_memory_gib"] for r in records)}


def traced(job) -> dict:
    """The runtime's step on fake tensors (plan --trace) and the planner's figures of the same job."""
    from launcher.plan.trace import run_trace

    trace = run_trace(job)
    if trace.not_traced:
        raise SystemExit(f"not traced: {trace.not_traced}")
    figures = {}
    for source, figures_of in (("traced", trace.ranks[0]), ("planned", trace.planned)):
        # what the rank holds after its step (container.holdings), and the step's peak of live tensors
        for what, key in (("params", "parameter_bytes"), ("grads", "gradient_bytes"),
                          ("optimizer", "optimizer_bytes"), ("peak", "peak_bytes")):
            figures[f"{source}_{what}"] = figures_of[key] / GIB
    return figures


def trainable(job) -> tuple[int, int]:
    from launcher.wire.training.lora import lora_settings, trainable_parameters

    lora = lora_settings(job.config.hyperparameters, job.model)
    every = job.model.parameter_count()
    return (every, every) if lora is None else trainable_parameters(job.model, lora)


def measure(case: str, opts: argparse.Namespace) -> dict:
    hp = hyperparameters(case, opts)
    job = validated(hp)
    row = {"case": case, "trainable": trainable(job), **traced(job), **run(hp)}
    row["median_step_s"] = statistics.median(row["step_s"])
    print(f"{case}: median step {row['median_step_s']:.2f} s (steps {', '.join(f'{s:.2f}' for s in row['step_s'])}), "
          f"peak RSS {row['rss_gib']:.2f} GiB, traced peak {row['traced_peak']:.2f} GiB, planned "
          f"{row['planned_peak']:.2f} GiB", flush=True)
    return row


def print_table(rows: list[dict]) -> None:
    full = next((r for r in rows if r["case"] == "full"), rows[0])
    print("| job | trainable | median step s | x full | fastest step s | x full | peak RSS GiB | x full | "
          "traced / planned peak GiB | "
          "traced / planned held: params, grads, optimizer GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        share = 100 * r["trainable"][0] / r["trainable"][1]
        held = ", ".join(f"{r[f'traced_{k}']:.2f} / {r[f'planned_{k}']:.2f}" for k in ("params", "grads", "optimizer"))
        print(f"| {r['case']} | {r['trainable'][0] / 1e6:.1f}M ({share:.2f}%) | {r['median_step_s']:.2f} | "
              f"{r['median_step_s'] / full['median_step_s']:.3f} | {min(r['step_s']):.2f} | "
              f"{min(r['step_s']) / min(full['step_s']):.3f} | {r['rss_gib']:.2f} | "
              f"{r['rss_gib'] / full['rss_gib']:.3f} | {r['traced_peak']:.2f} / {r['planned_peak']:.2f} | {held} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama3.2-1b")
    parser.add_argument("--layers", type=int, default=4, help="the preset's blocks kept (num_layers)")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary (the preset's 128,256 would dominate)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help=f"steps of each run ({WARMUP} warm-up left out)")
    parser.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    opts = parser.parse_args()
    import torch

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"{opts.preset} at {opts.layers} layers, vocabulary {opts.vocab}, seq {opts.seq}, batch {opts.batch}, "
          f"fp32, {opts.steps} steps")
    rows = [measure(case, opts) for case in opts.cases]
    print()
    print_table(rows)
    if opts.json:
        opts.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
