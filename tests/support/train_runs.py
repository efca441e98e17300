"""Helpers to run entrypoints/train.py as a user would (torchrun on 127.0.0.1, gloo) and read its metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.wire.opt_ml import free_port

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "entrypoints" / "train.py"

TINY = {
    "model_preset": "llama3-tiny",
    "dataset_type": "synthetic",
    "max_context_width": 64,
    "train_batch_size": 4,  # the global batch; callers divide it over data-parallel ranks
    "max_steps": 6,
    "lr": 0.03,  # large enough that a subtly wrong layout moves the loss past the tolerance
    "warmup": 0.0,
    "min_lr": 0.003,
    "seed": 7,
    "logging_freq": 1,
}


def run_train(tmp: Path, nproc: int, timeout: int = 240, **hyperparameters) -> list[dict]:
    """Run train.py on `nproc` local processes; return metrics.jsonl's records."""
    tmp.mkdir(parents=True, exist_ok=True)
    args = {**TINY, **hyperparameters}
    argv = []
    for key, value in args.items():
        argv += [f"--{key}", str(value)]
    out = tmp / "out"
    argv += ["--output_data_dir", str(out), "--model_dir", str(tmp / "model"),
             "--checkpoint_dir", str(tmp / "checkpoints")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(TRAIN), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("SAGEMAKER_BASE_DIR", None)
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# fp32's unit roundoff. Two runs that add the same n numbers in another order (another layout, a
# chunked loss) may differ by up to about n x u relative in each sum (Higham, "Accuracy and
# Stability of Numerical Algorithms", 2002, section 4.2); the losses and norms of metrics.jsonl
# are unrounded, so a comparison of them holds to that bound, not to luck of rounding.
FP32_UNIT_ROUNDOFF = 2.0**-24


def order_tolerance(terms: int) -> float:
    """The relative tolerance of two fp32 sums of `terms` numbers added in different orders."""
    return terms * FP32_UNIT_ROUNDOFF


def series(records: list[dict], key: str) -> list[float]:
    return [r[key] for r in records if key in r and "val_loss" not in r]


def assert_same_export(ours_dir: Path, ref_dir: Path, spec) -> None:
    """Two exports of one training run in different layouts: the same config and tensor shapes, and
    loaded into a plain model (`spec`'s shape) they compute the same logits (rel 1e-4: the
    layouts' fp32 sums differ in order over 6 steps)."""
    import torch
    from safetensors.torch import load_file

    from container.checkpoint.hf_export import load_hf_weights
    from container.models.llama import build_model

    config = json.loads((ours_dir / "config.json").read_text())
    assert config == json.loads((ref_dir / "config.json").read_text())
    ours, ref = (load_file(d / "model.safetensors") for d in (ours_dir, ref_dir))
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in ref.items()}
    tokens = torch.randint(0, config["vocab_size"], (2, TINY["max_context_width"]),
                           generator=torch.Generator().manual_seed(0))
    logits = []
    for directory in (ours_dir, ref_dir):
        model = build_model(spec, TINY["max_context_width"])
        load_hf_weights(model, directory)
        with torch.no_grad():
            logits.append(model(tokens))
    assert (logits[0] - logits[1]).abs().max().item() <= 1e-4 * logits[1].abs().max().item()


REL = 1e-5


def assert_same_training(records, reference, rel=REL):
    assert series(records, "step") == series(reference, "step")
    for key in ("loss", "grad_norm"):
        ours, ref = series(records, key), series(reference, key)
        assert ours == pytest.approx(ref, rel=rel), f"{key}: {ours} != {ref}"
