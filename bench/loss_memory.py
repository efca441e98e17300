"""Peak memory and time of the loss (forward + backward) with and without chunking, on CPU.

A 16K-equivalent scale: one sequence of 16,384 tokens, as in the seed's p4d run, with Llama 3.1
8B's vocabulary and width both cut 16-fold (128,256 / 16 = 8,016 entries, 4,096 / 16 = 256) so
that a case runs in seconds and a few GiB; every term of the loss's memory is tokens x vocabulary
or tokens x width, so the figures x 16 are those of the 8B model's loss. The model is smlaunch's
Transformer without blocks (embedding, final norm, head, loss:
`model(tokens, labels=..., loss_chunk_tokens=C)`, the trainer's call), in
bf16 as FSDP2's mixed precision computes it; tp 2 shards the head by vocabulary over two gloo
ranks (tensor_parallel.apply_tp, vocabulary-parallel loss).

Measure: every case runs in fresh processes (one per rank). After a warm-up step (gradient
buffers allocated and kept), the peak resident set (VmHWM, reset through /proc/self/clear_refs)
during one forward+backward, minus the resident set before it; glibc is told to mmap every
buffer over 64 KiB, so freed tensors leave the resident set. torch's CPU allocator is not
seen by tracemalloc, so the kernel's count is the honest one. The largest rank is reported,
with the planner's logits term (launcher/plan/terms.py) for the same shapes and the best of
the measured steps' wall time.

Run: `.venv/bin/python bench/loss_memory.py [--tokens 16384] [--vocab 8016] [--dim 256]
[--chunks 0 8192 4096 2048 1024] [--tp 1 2] [--steps 2]`.
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

from container.distributed.tensor_parallel import apply_tp, loss_context
from container.models.llama import Transformer, TransformerArgs
from launcher.wire.opt_ml import free_port

MIB = 2**20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1)) * 1024


def planned_bytes(tokens: int, vocab: int, dim: int, chunk: int, tp: int, a: int = 2) -> float:
    """launcher/plan/terms.py's logits term for these shapes (bf16: a = 2)."""
    if 0 < chunk < tokens:
        return 12 * chunk * vocab / tp + a * tokens * dim
    return 12 * tokens * vocab / tp


def worker(rank: int, tp: int, chunk: int, port: int, opts: argparse.Namespace, results) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
    if tp > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=tp)
    try:
        args = TransformerArgs(dim=opts.dim, n_layers=0, n_heads=8, n_kv_heads=8, vocab_size=opts.vocab,
                               ffn_dim=opts.dim, max_seq_len=opts.tokens)
        torch.manual_seed(0)
        model = Transformer(args)
        model.init_weights()
        model.to(torch.bfloat16)
        if tp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            apply_tp(model, init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))["tp"])
        tokens = torch.randint(0, opts.vocab, (1, opts.tokens), generator=torch.Generator().manual_seed(1))
        labels = torch.roll(tokens, -1, 1)

        def step() -> None:
            with loss_context(tp):
                loss, _ = model(tokens, labels=labels, loss_chunk_tokens=chunk)
                loss.backward()

        step()  # warm-up: gradient buffers, thread pools, gloo
        model.zero_grad(set_to_none=False)
        rss, walls = 0, []
        for _ in range(opts.steps):
            gc.collect()
            if tp > 1:
                dist.barrier()
            base = _status("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current resident set
            start = time.perf_counter()
            step()
            walls.append(time.perf_counter() - start)
            rss = max(rss, _status("VmHWM") - base)
            model.zero_grad(set_to_none=False)
        results.put((rank, rss, min(walls)))
    finally:
        if tp > 1:
            dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=128256 // 16)
    parser.add_argument("--dim", type=int, default=4096 // 16)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 8192, 4096, 2048, 1024],
                        help="loss_chunk_tokens per case; 0: the whole logits")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=2, help="measured steps after one warm-up")
    opts = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by the workers' glibc at start
    ctx = mp.get_context("spawn")
    scale = 128256 / opts.vocab
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"{opts.tokens} tokens, vocab {opts.vocab} (Llama 3's / {scale:g}), dim {opts.dim}, bf16")
    print(f"{'tp':>3} {'chunk':>6} {'peak MiB':>9} {'x whole':>8} {'planned MiB':>12} "
          f"{'x16 GiB (8B)':>13} {'wall s':>7}")
    for tp in opts.tp:
        whole = None
        for chunk in opts.chunks:
            results = ctx.SimpleQueue()
            mp.start_processes(worker, args=(tp, chunk, free_port(), opts, results), nprocs=tp, join=True,
                               start_method="spawn")
            rows = [results.get() for _ in range(tp)]
            rss, wall = max(r[1] for r in rows), max(r[2] for r in rows)
            whole = whole or rss
            planned = planned_bytes(opts.tokens, opts.vocab, opts.dim, chunk, tp)
            print(f"{tp:>3} {chunk or 'whole':>6} {rss / MIB:>9.1f} {rss / whole:>8.3f} {planned / MIB:>12.1f} "
                  f"{rss * scale / 2**30:>13.2f} {wall:>7.2f}")


if __name__ == "__main__":
    main()
