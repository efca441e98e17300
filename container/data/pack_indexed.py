"""`pack --format indexed`: documents' tokens into indexed token shards (container.data.indexed),
the channel layout a job with `dataset_type: indexed` reads (`--format megatron`: the same layout of
Megatron-Core pairs, container.data.megatron_writer):

    DIR/train/train-00000.{bin,idx}, train-00001.{bin,idx}, ...
    DIR/validation/validation-00000.{bin,idx}, ...      (with --validation-fraction F)

Documents stay whole (the job cuts rows of its max_context_width when it reads, so one pack
serves every sequence length). With --validation-fraction, document i (from 0, in reading order)
validates when the 8-byte blake2b digest of "{seed}:{i}", big-endian over 2^64, is below F, as
blocks do for JSON Lines. Every file is written as a hidden temporary and renamed into place at
the end; shards an --overwrite replaces are removed only then, so an error or an interrupt leaves
the previous channel as it was.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from container.data.corpus import PackError
from container.data.indexed import DEFAULT_SHARD_TOKENS, ShardWriter
from container.data.megatron_writer import MegatronWriter
from launcher.wire.token_shards import BIN_SUFFIX, IDX_SUFFIX

SPLITS = ("train", "validation")


@dataclass
class IndexedSummary:
    vocab_size: int
    vocabulary: str
    directories: list[Path]  # train, then validation when split
    format: str = "indexed"
    documents: int = 0
    tokens: int = 0
    split_documents: list[int] = field(default_factory=lambda: [0, 0])
    split_tokens: list[int] = field(default_factory=lambda: [0, 0])
    shards: list[int] = field(default_factory=lambda: [0, 0])
    seconds: float = 0.0

    def line(self) -> str:
        where = "; ".join(f"{name}: {self.shards[i]} shard(s), {self.split_documents[i]:,} documents, "
                          f"{self.split_tokens[i]:,} tokens in {directory}"
                          for i, (name, directory) in enumerate(zip(SPLITS, self.directories)))
        megatron = self.format == "megatron"
        what = "Megatron-Core .bin/.idx pairs" if megatron else "indexed token shards"
        unrecorded = ", which the pairs do not record: a job names the tokenizer, or vocab_size" if megatron else ""
        return (f"wrote {what} ({where}) from {self.documents:,} documents, {self.tokens:,} tokens; "
                f"vocab_size {self.vocab_size} ({self.vocabulary}{unrecorded}); "
                f"{self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s")


def targets(args: argparse.Namespace) -> list[Path]:
    """The split directories, checked before anything is read or written: shards already there
    need --overwrite, and no input may lie inside them."""
    root = Path(args.output_dir)
    if root.exists() and not root.is_dir():
        raise PackError(f"--output-dir {root}: exists and is not a directory")
    directories = [root / SPLITS[0]] + ([root / SPLITS[1]] if args.validation_fraction is not None else [])
    inputs = [Path(name).resolve() for name in args.input or ()]
    for directory in directories:
        if directory.exists() and not directory.is_dir():
            raise PackError(f"--output-dir: {directory} exists and is not a directory")
        old = _shard_files(directory)
        if old and not args.overwrite:
            raise PackError(f"--output-dir: {directory} holds shards ({old[0].name}, ...); pass --overwrite to "
                            f"replace them")
        resolved = directory.resolve()
        read = next((p for p in inputs if p == resolved or resolved in p.parents or p in resolved.parents), None)
        if read is not None:
            raise PackError(f"--output-dir: {directory} would also be read as --input {read}; write the output "
                            f"elsewhere")
    return directories


def _shard_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(f for f in directory.iterdir() if f.is_file() and f.suffix in (BIN_SUFFIX, IDX_SUFFIX))


def pack(args: argparse.Namespace, directories: list[Path], token_lists: Iterable[list[int]], vocab_size: int,
         vocabulary: str, tokenizer: dict, is_validation) -> IndexedSummary:
    """Write `token_lists` (one per document) into the split directories' shards."""
    summary = IndexedSummary(vocab_size, vocabulary, directories, args.format)
    start = time.perf_counter()
    shard_tokens = args.shard_tokens or DEFAULT_SHARD_TOKENS
    replaced = [_shard_files(directory) for directory in directories]  # an earlier pack's, if any
    # the directories this pack makes (the split's and any parent), removed again if it fails
    made = sorted({d for directory in directories for d in (directory, *directory.parents) if not d.exists()},
                  key=lambda d: len(d.parts), reverse=True)
    writer_class = MegatronWriter if args.format == "megatron" else ShardWriter
    writers = [writer_class(directory, SPLITS[i], vocab_size=vocab_size, tokenizer=tokenizer,
                            shard_tokens=shard_tokens) for i, directory in enumerate(directories)]
    fraction, seed = args.validation_fraction, args.seed or 0
    try:
        for index, ids in enumerate(counted(token_lists, summary)):
            split = int(fraction is not None and is_validation(index, fraction, seed))
            writers[split].add(ids)
            summary.split_documents[split] += 1
            summary.split_tokens[split] += len(ids)
        _check_splits(summary, fraction, seed)
    except BaseException:
        for writer in writers:
            writer.abort()
        for directory in made:
            with suppress(OSError):  # not empty: someone else wrote there meanwhile
                directory.rmdir()
        raise
    for i, (writer, old) in enumerate(zip(writers, replaced)):
        summary.shards[i] = len(writer.commit())
        written = {final for _, final in writer.paths}
        for stale in old:  # the earlier pack's shards that no new one replaced would join the channel
            if stale not in written:
                stale.unlink()
    summary.seconds = time.perf_counter() - start
    return summary


def counted(token_lists: Iterable[list[int]], summary) -> Iterator[list[int]]:
    """The token lists, counted into `summary.documents` and `.tokens` as they are taken (either
    format's summary)."""
    for ids in token_lists:
        summary.documents += 1
        summary.tokens += len(ids)
        yield ids


def _check_splits(summary: IndexedSummary, fraction: float | None, seed: int) -> None:
    if not summary.tokens:
        raise PackError(f"no tokens: the {summary.documents} documents are empty; give other input")
    if fraction is not None and not all(summary.split_documents):
        train, validation = summary.split_documents
        raise PackError(f"--validation-fraction {fraction} (--seed {seed}) split the {train + validation} documents "
                        f"into train {train}, validation {validation}; each needs one at least: give more input "
                        f"or another fraction")
