"""Document masking's cost on the exact (dense-mask) attention path: one forward and backward of
the same packed batch with its documents masked, against plain causal attention, on one process.

The figure is the ratio masked / causal of the median step time over alternating runs (the
machine's other load moves both alike). The masked step builds one [B, 1, S, S] boolean mask per
forward (container.models.attention.document_mask), which every layer's SDPA applies instead of
its own causal mask. GPU kernels that skip the masked blocks are the GPU path (docs/data.md).
Run: `.venv/bin/python bench/document_masking.py [--preset llama3-tiny] [--seq 1024] [--batch 4]
[--documents 8] [--pairs 7]`.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from container.data.loader import shift_labels
from container.loss import token_loss_sum
from container.models.llama import build_model
from launcher.config.models import PRESETS


def packed_batch(seq: int, batch: int, documents: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """`batch` rows of `documents` documents of random lengths each, as the loader gives them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    positions, docs = torch.empty_like(ids), torch.empty_like(ids)
    for row in range(batch):
        cuts = torch.randperm(seq - 1, generator=g)[:documents - 1].add(1).sort().values.tolist()
        for d, (start, end) in enumerate(zip([0, *cuts], [*cuts, seq])):
            positions[row, start:end] = torch.arange(end - start)
            docs[row, start:end] = d
    labels = shift_labels(ids)
    labels[:, :-1][positions[:, 1:] == 0] = -100
    return {"input_ids": ids, "labels": labels, "positions": positions, "documents": docs}


def step_seconds(model, batch: dict) -> float:
    start = time.perf_counter()
    loss, tokens = token_loss_sum(model, batch)
    (loss / tokens).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama3-tiny")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--pairs", type=int, default=7)
    args = p.parse_args()
    spec = PRESETS[args.preset]
    torch.manual_seed(0)
    model = build_model(spec, args.seq)
    model.init_weights()
    masked = packed_batch(args.seq, args.batch, args.documents, spec.vocab_size)
    causal = {"input_ids": masked["input_ids"], "labels": shift_labels(masked["input_ids"])}
    for batch in (masked, causal):  # warm-up: allocator, kernels
        step_seconds(model, batch)
    times: dict[str, list[float]] = {"masked": [], "causal": []}
    for _ in range(args.pairs):
        times["masked"].append(step_seconds(model, masked))
        times["causal"].append(step_seconds(model, causal))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{platform.node()} torch {torch.__version__}, {torch.get_num_threads()} threads; {args.preset}, "
          f"{args.batch} rows x {args.seq} tokens, {args.documents} documents a row, {args.pairs} pairs")
    for name, median in medians.items():
        print(f"  {name:7s} median step {median * 1000:8.1f} ms  ({', '.join(f'{t * 1000:.0f}' for t in times[name])})")
    print(f"  masked / causal: {medians['masked'] / medians['causal']:.3f}")


if __name__ == "__main__":
    main()
