"""Document masking's cost: the same packed batch trained with its documents masked, by each
document kernel (container.models.document_kernels), against plain causal attention.

`--what step` (the default): one forward and backward of a model over the batch, on CPU or GPU.
`--what attention`: attention alone at a model's head shapes (forward and backward), each
kernel's plan timed apart; with `--one-document` every row is a single document, so a masked row
has exactly a causal row's work and the ratio is the masking machinery's own overhead.

Figures are ratios kernel / causal of the median time over rounds that run every variant once
in turn (the machine's other load moves them alike). On a GPU the model runs in bf16 and the
step's loss over chunks of 2048 tokens (as the runtime's default). Run:
  CPU: `.venv/bin/python bench/document_masking.py --seq 512 --pairs 5`
  GPU: `python bench/document_masking.py --device cuda --preset llama3.2-1b --seq 16384 --batch 1
        --documents 8 --kernels dense,flex,varlen`
       `python bench/document_masking.py --device cuda --what attention --preset llama3.1-8b
        --seq 65536 --documents 32 --kernels flex,varlen`
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from container.data.loader import shift_labels
from container.loss import token_loss_sum
from container.models import attention
from container.models.document_kernels import build
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS


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


def timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def step_variants(args, device: torch.device) -> dict[str, Callable[[], object]]:
    spec = PRESETS[args.preset]
    torch.manual_seed(0)
    model = build_model(spec, args.seq, device=device)
    model.init_weights()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    chunk = 2048 if device.type == "cuda" else 0
    masked = {k: v.to(device) for k, v in packed_batch(args.seq, args.batch, args.documents, spec.vocab_size).items()}
    causal = {"input_ids": masked["input_ids"], "labels": shift_labels(masked["input_ids"])}
    kernels = {name: build(name, device, bf16=device.type == "cuda") for name in args.kernels}

    def step(batch, kernel=None):
        def run():
            previous = attention.use_kernel(kernel) if kernel is not None else None
            try:
                loss, tokens = token_loss_sum(model, batch, chunk)
                (loss / tokens).backward()
            finally:
                if kernel is not None:
                    attention.use_kernel(previous)
            model.zero_grad(set_to_none=True)
        return run

    return {"causal": step(causal), **{name: step(masked, kernel) for name, kernel in kernels.items()}}


def attention_variants(args, device: torch.device, plans: dict[str, list[float]]) -> dict[str, Callable[[], object]]:
    spec = PRESETS[args.preset]
    head_dim = spec.hidden_size // spec.num_heads
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(args.batch, h, args.seq, head_dim, device=device, dtype=dtype, generator=g)
               .requires_grad_() for h in (spec.num_heads, spec.num_kv_heads, spec.num_kv_heads))
    grad = torch.randn_like(q)
    docs = packed_batch(args.seq, args.batch, args.documents, 2)["documents"].to(device)

    def causal(backend=None):
        def run():
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(grad)
        return run

    def masked(kernel, name):
        def run():
            start = time.perf_counter()
            plan = kernel.plan(docs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            plans[name].append(time.perf_counter() - start)
            kernel.attend(q, k, v, plan).backward(grad)
        return run

    # SDPA picks its causal kernel itself (on an H100: cuDNN's or flash's); each named one is
    # timed too where it runs, so the ratios say what a masked kernel is compared with
    backends = {}
    if device.type == "cuda":
        for label, backend in (("c-flash", SDPBackend.FLASH_ATTENTION), ("c-cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                causal(backend)()
                backends[label] = causal(backend)
            except RuntimeError as exc:
                print(f"  ({label}: {str(exc).splitlines()[0][:100]})")
    return {"causal": causal(), **backends,
            **{name: masked(build(name, device, bf16=dtype == torch.bfloat16), name) for name in args.kernels}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--what", choices=("step", "attention"), default="step")
    p.add_argument("--device", default="cpu")
    p.add_argument("--preset", default="llama3-tiny")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--documents", type=int, default=8, help="documents a row (random lengths)")
    p.add_argument("--one-document", action="store_true", help="each row one document (the overhead alone)")
    p.add_argument("--kernels", default="dense", help="comma-separated: dense, flex, varlen")
    p.add_argument("--pairs", type=int, default=7, help="timed rounds")
    args = p.parse_args()
    args.kernels = [k for k in args.kernels.split(",") if k]
    if args.one_document:
        args.documents = 1
    device = torch.device(args.device)
    plans: dict[str, list[float]] = {name: [] for name in args.kernels}
    variants = step_variants(args, device) if args.what == "step" else attention_variants(args, device, plans)
    for fn in variants.values():  # warm-up: compilation, allocator, kernels' autotuning
        for _ in range(2):
            timed(fn, device)
    for values in plans.values():
        values.clear()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.pairs):
        for name, fn in variants.items():
            times[name].append(timed(fn, device))
    medians = {name: statistics.median(values) for name, values in times.items()}
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"{platform.node()} torch {torch.__version__}, {where}; {args.what} of {args.preset}, {args.batch} row(s) "
          f"x {args.seq} tokens, {args.documents} document(s) a row, {args.pairs} rounds")
    for name, median in medians.items():
        plan = f"; plan {statistics.median(plans[name]) * 1000:.2f} ms" if plans.get(name) else ""
        print(f"  {name:7s} median {median * 1000:9.2f} ms  {name}/causal {median / medians['causal']:.3f}{plan}")


if __name__ == "__main__":
    main()
