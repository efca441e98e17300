"""Helpers to run entrypoints/train.py's ranks as torchrun starts them (gloo on 127.0.0.1) and read
its metrics.

The ranks are forked from the test process's fork server (tests/support/forkserver.py), each with
the environment torchrun gives a rank (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), the test's own environment and working directory, and its output in a file of its
own; a rank that fails stops the others, as torchrun's agent does. What differs from torchrun is
only the start: no agent process and no fresh interpreter per rank (4 ranks: 15 s of CPU with
torchrun, ~2 s here). torchrun itself is what local mode, the bootstrap, the containers and Slurm
run (tests/integration/test_local_mode.py, test_bootstrap.py, test_container_e2e.py, e2e/).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from launcher.wire.opt_ml import free_port
from launcher.wire.training.models import PRESETS
from tests.support import forkserver
from tests.support.close import assert_close, llama_terms, logits_terms, order_tolerance

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
# After one rank fails, how long the others have to leave before SIGTERM (then as long before SIGKILL).
GRACE_S = 5


def run_train(tmp: Path, nproc: int, timeout: int = 240, rank=None, env: dict[str, str] | None = None,
              **hyperparameters) -> list[dict]:
    """Run train.py on `nproc` local ranks; return metrics.jsonl's records. A failed run raises
    AssertionError with the end of every rank's output. A hyperparameter given as None is left
    out (model_preset=None: the model of other hyperparameters). `rank`: what each rank runs, when
    not `_rank` (a module-level function of the same arguments that ends by calling it). `env`:
    variables for the ranks alone, beside the test's environment (the fork server, which outlives
    the test, never sees them)."""
    tmp.mkdir(parents=True, exist_ok=True)
    args = {key: value for key, value in {**TINY, **hyperparameters}.items() if value is not None}
    argv = []
    for key, value in args.items():
        argv += [f"--{key}", str(value)]
    out = tmp / "out"
    argv += ["--output_data_dir", str(out), "--model_dir", str(tmp / "model"),
             "--checkpoint_dir", str(tmp / "checkpoints")]
    ranks_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(nproc),
                 "LOCAL_WORLD_SIZE": str(nproc)}
    ranks_env.pop("SAGEMAKER_BASE_DIR", None)
    logs = tmp / "rank-logs"
    logs.mkdir(exist_ok=True)
    context = mp.start_processes(rank or _rank, args=(argv, ranks_env, str(tmp), str(logs)), nprocs=nproc, join=False,
                                 start_method=forkserver.start_method())
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1, grace_period=GRACE_S):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise AssertionError(f"train.py ran past {timeout} s:\n{_tails(logs, nproc)}")
    except mp.ProcessExitedException as exc:
        raise AssertionError(f"train.py failed (rank {exc.error_index}, exit {exc.exit_code}):\n"
                             f"{_tails(logs, nproc)}") from None
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _rank(local_rank: int, argv: list[str], env: dict[str, str], cwd: str, logs: str) -> None:
    """One rank, in a process forked from the fork server: train.py's `main` as its script runs it."""
    os.environ.clear()
    os.environ.update(env, RANK=str(local_rank), LOCAL_RANK=str(local_rank), GROUP_RANK="0")
    tempfile.tempdir = None  # the server's, cached: a rank reads TMPDIR as a program does
    os.chdir(cwd)
    log = os.open(Path(logs) / f"rank{local_rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    sys.argv = [str(TRAIN), *argv]
    import torch

    torch.set_num_threads(1)  # the server imported torch before OMP_NUM_THREADS was this rank's
    from container.distributed.runtime import run_rank
    from entrypoints.train import main

    run_rank(main, argv)  # leaves the process with train.py's exit code


def _tails(logs: Path, nproc: int) -> str:
    parts = []
    for rank in range(nproc):
        path = logs / f"rank{rank}.log"
        text = path.read_text(errors="replace") if path.is_file() else "(no output)"
        parts.append(f"--- rank {rank} ---\n{text[-6000:]}")
    return "\n".join(parts)


def series(records: list[dict], key: str) -> list[float]:
    return [r[key] for r in records if key in r and "val_loss" not in r]


def assert_same_export(ours_dir: Path, ref_dir: Path, spec) -> None:
    """Two exports of one training run in different layouts: the same config and tensor shapes, and
    loaded into a plain model (`spec`'s shape) they compute the same logits, within the order
    tolerance of TINY's steps: each step's gradients (llama_terms over its batch) reach the weights
    with their own rounding, then one forward pass adds its own (logits_terms)."""
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
    seq = TINY["max_context_width"]
    steps = TINY["max_steps"] * llama_terms(spec, seq, TINY["train_batch_size"] * seq)
    assert_close(logits[0], logits[1], terms=steps + logits_terms(spec, seq), what="the exports' logits")


def layout_tolerance(spec) -> float:
    """How far one TINY run's losses and gradient norms may be from another layout's, relative:
    the order tolerance of the loss's sums over TINY's batch (tests/support/close.py) for `spec`,
    the model trained. Measured differences over TINY's 6 steps, here and under MKL_CBWR=COMPATIBLE,
    stay under a sixteenth of it (at most 4.2e-6: context parallelism with data parallelism)."""
    seq = TINY["max_context_width"]
    return order_tolerance(llama_terms(spec, seq, TINY["train_batch_size"] * seq))


# llama3-tiny's: 7e-5, for every tiny model a layout test trains (64 wide, 2 to 4 layers: their
# own are within -14% and +51% of it, and they differ by at most 1e-6 across layouts).
REL = layout_tolerance(PRESETS["llama3-tiny"])


def assert_same_training(records, reference, rel=REL):
    assert series(records, "step") == series(reference, "step")
    for key in ("loss", "grad_norm"):
        ours, ref = series(records, key), series(reference, key)
        assert ours == pytest.approx(ref, rel=rel), f"{key}: {ours} != {ref}"
