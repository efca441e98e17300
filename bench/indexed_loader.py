"""The indexed-shard loader at corpus scale: samples/s per rank for 16K-token rows, the time of a
resume at the first and at the last sample, and resident memory against the corpus's size; for
smlaunch's own shards and for Megatron-Core .bin/.idx pairs of the same documents (`--formats`).

The corpus is generated, not packed: a shard whose `.bin` is a sparse file of the asked size
(the tokens read as zeros; the file system stores nothing for them) and whose `.idx` holds
documents of random lengths (mean 4,096 tokens) over it, so a 10 GB-class file costs no disk and
no minutes to make. Each measurement runs in a fresh process (resident memory is the process's
peak), reading `--batches` shuffled micro-batches of one data-parallel rank of `--ranks` as the
trainer does; the figures are medians over `--repeats` runs and ratios within one run of this
script. Run: `.venv/bin/python bench/indexed_loader.py [--gigabytes 10 1] [--seq 16384]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_corpus(directory: Path, gigabytes: float, seed: int = 0, fmt: str = "smlaunch") -> Path:
    """A uint16 shard of `gigabytes` GB (sparse tokens) with documents of random lengths, in
    smlaunch's format or as a Megatron pair (one sequence a document)."""
    from launcher.wire.megatron_index import encode_prefix
    from launcher.wire.token_shards import encode_header

    tokens = int(gigabytes * 1e9) // 2
    g = np.random.default_rng(seed)
    lengths = g.integers(1, 8192, tokens // 4096 + 1)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    offsets = offsets[offsets < tokens]
    offsets = np.append(offsets, tokens)
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "train-00000.bin").open("wb") as f:
        f.truncate(tokens * 2)
    if fmt == "megatron":
        documents = len(offsets) - 1
        with (directory / "train-00000.idx").open("wb") as f:
            f.write(encode_prefix("uint16", documents, documents))
            f.write(np.diff(offsets).astype("<i4").tobytes())
            f.write((offsets[:-1] * 2).astype("<i8").tobytes())
            f.write(np.arange(documents + 1, dtype="<i8").tobytes())
        return directory
    header = {"format": "smlaunch indexed tokens", "dtype": "uint16", "vocab_size": 256, "documents": len(offsets) - 1,
              "tokens": tokens, "max_token_id": 0, "tokenizer": {"name": "bench", "vocabulary_sha256": None},
              "lengths": {"buckets": []}}
    with (directory / "train-00000.idx").open("wb") as f:
        f.write(encode_header(header))
        f.write(offsets.astype("<i8").tobytes())
    return directory


def worker(spec: dict) -> dict:
    """One measurement, in this (fresh) process."""
    import resource

    from container.data.loader import build_dataloader

    start_sample = spec["start_sample"]
    t0 = time.perf_counter()
    loader = build_dataloader(dataset_type="indexed", path=spec["path"], seq_len=spec["seq"], micro_batch_size=1,
                              dp_rank=spec["ranks"] - 1, dp_size=spec["ranks"], vocab_size=256, seed=7,
                              shuffle=True, start_sample=start_sample)
    loader.next_batch()
    first = time.perf_counter() - t0  # open the shards, seek, read the first micro-batch
    t1 = time.perf_counter()
    for _ in range(spec["batches"]):
        batch = loader.next_batch()
    seconds = time.perf_counter() - t1
    return {"resume_s": first, "samples_per_s": spec["batches"] / seconds,
            "tokens": int(batch["input_ids"].numel()), "rows": loader.source.rows[0],
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gigabytes", type=float, nargs="+", default=[10.0, 1.0])
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--ranks", type=int, default=8, help="data-parallel ranks (one is measured)")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--formats", nargs="+", choices=("smlaunch", "megatron"), default=["smlaunch"])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    print(f"{platform.node()} python {platform.python_version()}; rows of {args.seq} tokens, rank {args.ranks - 1} "
          f"of {args.ranks}, {args.batches} micro-batches of 1 row, medians of {args.repeats} fresh processes")
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for gb, fmt in ((gb, fmt) for gb in args.gigabytes for fmt in args.formats):
            path = make_corpus(Path(tmp) / f"{gb:g}GB-{fmt}", gb, fmt=fmt)
            rows = (int(gb * 1e9) // 2) // args.seq
            runs = {"first": [], "last": []}
            for _ in range(args.repeats):  # alternating: the machine's load moves both alike
                for where, start in (("first", 0), ("last", rows * 3 - args.ranks)):  # the third epoch's end
                    runs[where].append(measure({"path": str(path), "seq": args.seq, "ranks": args.ranks,
                                                "batches": args.batches, "start_sample": start}))
            results[gb, fmt] = {where: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
                                for where, rs in runs.items()}
            first, last = results[gb, fmt]["first"], results[gb, fmt]["last"]
            print(f"  {gb:g} GB {fmt} ({rows:,} rows): {first['samples_per_s']:,.0f} samples/s "
                  f"({first['samples_per_s'] * args.seq / 1e6:,.1f} M tokens/s); resume at sample 0 "
                  f"{first['resume_s'] * 1000:.1f} ms, at sample {rows * 3 - args.ranks:,} "
                  f"{last['resume_s'] * 1000:.1f} ms (last/first {last['resume_s'] / first['resume_s']:.2f}); "
                  f"peak RSS {first['max_rss_mib']:.0f} MiB")
        for fmt in args.formats if len(args.gigabytes) > 1 else ():
            big, small = (results[gb, fmt]["first"]["max_rss_mib"] for gb in (args.gigabytes[0], args.gigabytes[-1]))
            print(f"  {fmt}: peak RSS {args.gigabytes[0]:g} GB / {args.gigabytes[-1]:g} GB: {big / small:.3f}")


if __name__ == "__main__":
    main()
