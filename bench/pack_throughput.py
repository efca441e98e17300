"""Throughput of `python -m container.data.packing`: a realistic model tokenizer against UTF-8 bytes.

The tokenizer is a byte-level BPE with a Llama-sized vocabulary (32,000 by default), trained
here with the `tokenizers` library on the Python standard library's sources (no network) and
saved as a transformers fast tokenizer with a BOS post-processor and an EOS token, like Llama
3's. Both paths then pack the same few MB of stdlib sources (one document per file) with
`--eos` where a tokenizer is used; runs alternate and medians are reported. The time covers
reading, tokenizing, grouping and writing JSON Lines, not loading the tokenizer.
Run: `.venv/bin/python bench/pack_throughput.py [--megabytes 6] [--vocab 32000] [--repeats 3]`.

`--against-datasets` (issue 29): the same stdlib sources as one JSON Lines corpus, tokenized by
`pack --format indexed --tokenizer --eos` against `datasets.load_dataset("json")` +
`.map(tokenizer, batched=True, num_proc=2)` (the usual way), both from the corpus file to
tokens on disk, the tokenizer's loading included; target pack >= 1.0x. Each run is a fresh
process, as each is when a user runs it, its libraries imported before the clock starts: in one
process, datasets' worker processes (a fork after the tokenizer has used its threads) leave the
parent's fast tokenizer single-threaded, which slowed every later run of pack by 1.5-2x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from container.data import packing
from container.data.encoders import load_tokenizer


def stdlib_sources(megabytes: float) -> list[Path]:
    """The first stdlib .py files (sorted, tests left out) that add up to `megabytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.relative_to(root).parts[0] or "site-packages" in path.parts:
            continue
        files.append(path)
        total += path.stat().st_size
        if total >= megabytes * 1e6:
            break
    return files


def train_tokenizer(files: list[Path], vocab: int, directory: Path) -> float:
    """Train and save the BPE; returns the seconds it took."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    start = time.perf_counter()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((f.read_text(encoding="utf-8", errors="replace") for f in files), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id(special[0]))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special[0], eos_token=special[1])
    fast.save_pretrained(directory)
    return time.perf_counter() - start


def measure(files: list[Path], out: Path, block: int, tokenizer: Path | None) -> packing.Summary:
    argv = ["--input", *map(str, files), "--output", str(out), "--block-size", str(block),
            "--overwrite", "--quiet"]
    if tokenizer is not None:
        argv += ["--tokenizer", str(tokenizer), "--eos"]
    return packing.run(packing.parse_args(argv))


def corpus_jsonl(files: list[Path], path: Path) -> Path:
    """The files as one JSON Lines corpus, {"text": ...} a document: the input both sides read."""
    with path.open("w", encoding="utf-8") as f:
        for file in files:
            f.write(json.dumps({"text": file.read_text(encoding="utf-8", errors="replace")}) + "\n")
    return path


def pack_indexed(corpus: Path, tokenizer: Path, out: Path) -> float:
    """Seconds of `pack --format indexed` over the corpus, the tokenizer's loading included."""
    start = time.perf_counter()
    packing.run(packing.parse_args(["--input", str(corpus), "--tokenizer", str(tokenizer), "--eos", "--format",
                                    "indexed", "--output-dir", str(out), "--overwrite", "--quiet"]))
    return time.perf_counter() - start


def datasets_map(corpus: Path, tokenizer: Path, cache: Path, num_proc: int) -> float:
    """Seconds of the usual alternative: load_dataset("json") then map(tokenizer, batched=True,
    num_proc) into the datasets cache (Arrow files), the tokenizer's loading included."""
    import shutil

    import datasets
    from transformers import AutoTokenizer

    shutil.rmtree(cache, ignore_errors=True)
    datasets.disable_progress_bars()
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(tokenizer)
    data = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))

    def tokenize(batch):
        ids = tok(batch["text"], return_attention_mask=False, verbose=False)["input_ids"]
        return {"input_ids": [doc + [tok.eos_token_id] for doc in ids]}

    data.map(tokenize, batched=True, num_proc=num_proc, remove_columns=["text"])
    return time.perf_counter() - start


def one_run(side: str, tmp: Path, num_proc: int) -> float:
    """Seconds of one run of `side` (pack or map) in a fresh process (see the module's docstring)."""
    out = subprocess.run([sys.executable, __file__, "--one-run", side, "--workdir", str(tmp),
                          "--num-proc", str(num_proc)], check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def run_one(side: str, tmp: Path, num_proc: int) -> float:
    # both sides' libraries are imported before the clock starts (transformers' AutoTokenizer too:
    # the import of transformers is lazy, and that name's first import alone takes ~2 s here)
    import datasets  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    corpus, tokenizer = tmp / "corpus.jsonl", tmp / "tokenizer"
    if side == "pack":
        return pack_indexed(corpus, tokenizer, tmp / "out")
    return datasets_map(corpus, tokenizer, tmp / "hf-cache", num_proc)


def against_datasets(args, files: list[Path], size: int) -> None:
    """pack --format indexed against datasets.map(batched=True, num_proc) on the same corpus."""
    with tempfile.TemporaryDirectory() as tmp:
        train_tokenizer(files, args.vocab, Path(tmp) / "tokenizer")
        corpus_jsonl(files, Path(tmp) / "corpus.jsonl")
        ours, theirs = [], []
        for _ in range(args.repeats):  # alternating, so machine noise hits both
            ours.append(one_run("pack", Path(tmp), args.num_proc))
            theirs.append(one_run("map", Path(tmp), args.num_proc))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"pack --format indexed: median {a:.2f} s ({size / 1e6 / a:.2f} MB/s); datasets.map(batched=True, "
          f"num_proc={args.num_proc}): median {b:.2f} s ({size / 1e6 / b:.2f} MB/s); "
          f"pack / datasets.map throughput {b / a:.2f}x")
    print("per-run seconds: pack " + " / ".join(f"{t:.2f}" for t in ours) + "; datasets.map "
          + " / ".join(f"{t:.2f}" for t in theirs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=float, default=6.0, help="stdlib sources to pack (and train on)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--block-size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against-datasets", action="store_true",
                        help="compare pack --format indexed with datasets.map(batched=True, num_proc)")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--one-run", choices=("pack", "map"), help=argparse.SUPPRESS)  # one_run's child
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run:
        print(f"{run_one(args.one_run, args.workdir, args.num_proc):.4f}")
        return 0
    if args.against_datasets:
        files = stdlib_sources(args.megabytes)
        size = sum(f.stat().st_size for f in files)
        print(f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
              f"{len(files)} stdlib files as one JSON Lines corpus, {size / 1e6:.2f} MB, BPE vocab {args.vocab}")
        against_datasets(args, files, size)
        return 0

    files = stdlib_sources(args.megabytes)
    size = sum(f.stat().st_size for f in files)
    print(f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
          f"{len(files)} stdlib files, {size / 1e6:.2f} MB, block size {args.block_size}")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = Path(tmp) / "tokenizer"
        seconds = train_tokenizer(files, args.vocab, tokenizer)
        start = time.perf_counter()
        vocab = len(load_tokenizer(str(tokenizer)))
        print(f"BPE tokenizer: vocab {vocab}, trained in {seconds:.1f} s on the same files, "
              f"loaded in {time.perf_counter() - start:.2f} s")
        runs: dict[str, list[packing.Summary]] = {"bytes": [], "tokenizer": []}
        for _ in range(args.repeats):  # alternating, so machine noise hits both
            runs["bytes"].append(measure(files, Path(tmp) / "bytes.jsonl", args.block_size, None))
            runs["tokenizer"].append(measure(files, Path(tmp) / "tokens.jsonl", args.block_size, tokenizer))
    print(f"{'tokens':<28}{'documents/s':>12}{'tokens/s':>12}{'MB/s':>8}{'tokens':>11}{'blocks':>8}")
    labels = {"tokenizer": f"BPE {vocab} (--tokenizer --eos)", "bytes": "UTF-8 bytes (default)"}
    for name, label in labels.items():
        seconds = statistics.median(s.seconds for s in runs[name])
        s = runs[name][0]
        print(f"{label:<28}{s.documents / seconds:>12,.0f}{s.tokens / seconds:>12,.0f}"
              f"{size / 1e6 / seconds:>8.2f}{s.tokens:>11,}{sum(s.blocks):>8,}")
    print(f"median of {args.repeats} runs each; per-run seconds: "
          + "; ".join(f"{name} " + " / ".join(f"{s.seconds:.2f}" for s in runs[name]) for name in runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
