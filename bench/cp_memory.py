"""Activation memory per rank and step time of context parallelism on CPU (gloo): cp = 1, 2, 4.

Every configuration trains on the same single sequence with the same model (a narrow Llama
whose activations dominate at long sequences), so total work is equal; cp ranks each hold 1/cp
of the tokens. Target (issue 4): activation memory at cp 4 <= 0.35 x that of cp 1.

Two measures of activation memory, per rank, largest rank reported:
- saved: bytes of the distinct tensor storages autograd saves for backward during the forward
  (saved-tensors hooks; parameters left out) -- what the activations hold at the forward's end;
- peak RSS: the peak resident set (VmHWM, reset through /proc/self/clear_refs) during one
  forward+backward, minus the resident set before it. The baseline is taken after a warm-up step,
  with the model, AdamW state and gradient buffers allocated; glibc is told to mmap every buffer
  over 64 KiB so freed activations leave the resident set.
Step time: the slowest rank's wall time of forward+backward, and the CPU seconds of all ranks
together (one thread per rank), relative to cp 1. On a machine with fewer cores than ranks the
wall time includes waiting for a core; CPU seconds are the cost of the same work.

Run: `.venv/bin/python bench/cp_memory.py [--seq 8192] [--dim 512] [--cp 1 2 4] [--steps 2]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from container.data.loader import shift_labels
from container.distributed import context_parallel as cpl
from container.models import attention
from container.models.llama import Transformer, TransformerArgs
from launcher.wire.opt_ml import free_port

MIB = 2**20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1)) * 1024


class SavedBytes:
    """Counts the distinct storages autograd saves, leaving the parameters out."""

    def __init__(self, model: torch.nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.params:
            self.seen[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def _step(model, batch, seq: int, saved: SavedBytes | None = None) -> None:
    with torch.autograd.graph.saved_tensors_hooks(saved.pack if saved else (lambda t: t), lambda t: t):
        logits = model(batch["input_ids"], batch.get("positions"))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100,
                               reduction="sum") / seq
    loss.backward()


def worker(rank: int, cp: int, port: int, opts: argparse.Namespace, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cp)
    try:
        args = TransformerArgs(dim=opts.dim, n_layers=opts.layers, n_heads=opts.heads, n_kv_heads=opts.kv_heads,
                               vocab_size=256, ffn_dim=int(opts.dim * 2.75), max_seq_len=opts.seq)
        torch.manual_seed(0)
        model = Transformer(args)
        model.init_weights()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, args.vocab_size, (1, opts.seq), generator=torch.Generator().manual_seed(1))
        batch = {"input_ids": ids, "labels": shift_labels(ids)}
        if cp > 1:
            batch = cpl.shard_batch(batch, cp, rank)
            attention.use(cpl.AllGatherAttention(dist.group.WORLD))
        _step(model, batch, opts.seq)  # warm-up: AdamW state, gradient buffers, gloo and thread pools
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        walls, cpus, saved_bytes, rss = [], [], 0, 0
        for _ in range(opts.steps):
            if cp > 1:  # a fresh one: the causal masks it caches on CPU count as activation memory,
                # so the step's peak must include making them
                attention.use(cpl.AllGatherAttention(dist.group.WORLD))
            gc.collect()
            dist.barrier()
            base = _status("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current resident set
            saved = SavedBytes(model)
            wall, cpu = time.perf_counter(), time.process_time()
            _step(model, batch, opts.seq, saved)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            rss = max(rss, _status("VmHWM") - base)
            saved_bytes = max(saved_bytes, saved.total)
            optimizer.zero_grad(set_to_none=False)
        results.put((cp, rank, saved_bytes, rss, min(walls), min(cpus)))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=2, help="measured steps after one warm-up (best time kept)")
    opts = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by the workers' glibc at start
    ctx = mp.get_context("spawn")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"seq {opts.seq}, dim {opts.dim}, heads {opts.heads}/{opts.kv_heads}, {opts.layers} layers, "
          "fp32, one thread per rank")
    print(f"{'cp':>3} {'saved MiB':>10} {'x cp1':>6} {'peak RSS MiB':>13} {'x cp1':>6} "
          f"{'wall s':>7} {'CPU s':>7} {'CPU x cp1':>9}")
    first = None
    for cp in opts.cp:
        results = ctx.SimpleQueue()
        mp.start_processes(worker, args=(cp, free_port(), opts, results), nprocs=cp, join=True, start_method="spawn")
        rows = [results.get() for _ in range(cp)]
        saved, rss = max(r[2] for r in rows), max(r[3] for r in rows)
        wall, cpu = max(r[4] for r in rows), sum(r[5] for r in rows)
        first = first or (saved, rss, cpu)
        print(f"{cp:>3} {saved / MIB:>10.1f} {saved / first[0]:>6.3f} {rss / MIB:>13.1f} {rss / first[1]:>6.3f} "
              f"{wall:>7.2f} {cpu:>7.2f} {cpu / first[2]:>9.3f}")


if __name__ == "__main__":
    main()
