"""Indexed token shards (format: launcher.wire.token_shards): writing them, and reading a channel's
shards as one memory-mapped stream of tokens whose fixed-length rows the loader trains on.

Rows are the seed's blocks: the channel's documents back to back, cut every `seq_len` tokens,
the remainder dropped, so row j is tokens [j·S, (j+1)·S) of the stream, and a document cut by a
row's end goes on as a new document in the next row (as `pack --format jsonl` writes its blocks).
A row is read with two slices of the memory-mapped files (its tokens, and the document starts
within it by binary search of the offsets): any row in O(log documents), whatever its place,
and a rank's memory holds only what it reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from container.data.megatron import MegatronDocuments, OffsetDocuments, token_dtype
from launcher.wire.megatron_index import MegatronHeader
from launcher.wire.token_shards import (
    BIN_SUFFIX,
    IDX_SUFFIX,
    ShardError,
    ShardHeader,
    dtype_for,
    encode_header,
    read_header,
    shard_indexes,
    unindexed_tokens,
)

# 2^30 tokens: 2 GiB of uint16 a shard, a size object stores and file systems move well.
DEFAULT_SHARD_TOKENS = 1 << 30


class _Lengths:
    """Documents' lengths in power-of-two buckets: count, sum and sum of squares of each."""

    def __init__(self):
        self.rows: dict[int, list[int]] = {}

    def add(self, length: int) -> None:
        row = self.rows.setdefault(max(length, 1).bit_length() - 1, [0, 0, 0])
        row[0] += 1
        row[1] += length
        row[2] += length * length

    def to_json(self) -> dict:
        return {"buckets": [[b, *self.rows[b]] for b in sorted(self.rows)]}


class ShardWriter:
    """Documents' tokens into shards `<directory>/<stem>-00000.{bin,idx}`, ... of at most
    `shard_tokens` tokens each (a document is never split; one longer than that is a shard of
    its own). Files are written as hidden temporaries and renamed into place by `commit`;
    `abort` removes them. Use as a context manager: it commits when the block ends normally."""

    def __init__(self, directory: Path, stem: str, *, vocab_size: int, tokenizer: dict,
                 shard_tokens: int = DEFAULT_SHARD_TOKENS):
        self.directory, self.stem = Path(directory), stem
        self.vocab_size, self.tokenizer, self.shard_tokens = vocab_size, tokenizer, shard_tokens
        self.dtype = dtype_for(vocab_size)
        self.paths: list[tuple[Path, Path]] = []  # (temporary, final) of every file written
        self.written: list[Path] = []  # the .idx files, once committed
        self.documents = self.tokens = 0
        self._bin = None
        self._offsets: list[int] = []

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.written = self.commit()
        else:
            self.abort()

    def add(self, ids: Sequence[int]) -> None:
        if self._bin is None or (self._offsets[-1] and self._offsets[-1] + len(ids) > self.shard_tokens):
            self._finish_shard()
            self._start_shard()
        tokens = np.asarray(ids, dtype=np.int64)
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            bad = int(tokens[(tokens < 0) | (tokens >= self.vocab_size)][0])
            raise ValueError(f"token id {bad} outside the vocabulary [0, {self.vocab_size})")
        self._bin.write(tokens.astype(np.dtype(self.dtype).newbyteorder("<")).tobytes())
        self._offsets.append(self._offsets[-1] + len(tokens))
        self._max = max(self._max, int(tokens.max()) if len(tokens) else 0)
        self._lengths.add(len(tokens))
        self.documents += 1
        self.tokens += len(tokens)

    def _start_shard(self) -> None:
        name = f"{self.stem}-{len(self.paths) // 2:05d}"
        self.directory.mkdir(parents=True, exist_ok=True)
        for suffix in (BIN_SUFFIX, IDX_SUFFIX):
            final = self.directory / f"{name}{suffix}"
            self.paths.append((final.with_name(f".{final.name}.{os.getpid()}.tmp"), final))
        self._bin = self.paths[-2][0].open("wb")
        self._offsets, self._max, self._lengths = [0], 0, _Lengths()

    def _finish_shard(self) -> None:
        if self._bin is None:
            return
        self._bin.close()
        header = {"format": "smlaunch indexed tokens", "dtype": self.dtype, "vocab_size": self.vocab_size,
                  "tokenizer": self.tokenizer, "documents": len(self._offsets) - 1, "tokens": self._offsets[-1],
                  "max_token_id": self._max, "lengths": self._lengths.to_json()}
        with self.paths[-1][0].open("wb") as f:
            f.write(encode_header(header))
            f.write(np.asarray(self._offsets, dtype="<i8").tobytes())
        self._bin = None

    def commit(self) -> list[Path]:
        """Finish the last shard and rename every file into place; the .idx files, in order."""
        self._finish_shard()
        for temp, final in self.paths:
            os.replace(temp, final)
        return [final for _, final in self.paths if final.suffix == IDX_SUFFIX]

    def abort(self) -> None:
        if self._bin is not None:
            self._bin.close()
            self._bin = None
        for temp, _ in self.paths:
            temp.unlink(missing_ok=True)


def write_shards(documents: Iterable[Sequence[int]], directory: Path, stem: str, *, vocab_size: int,
                 tokenizer: dict, shard_tokens: int = DEFAULT_SHARD_TOKENS) -> list[Path]:
    """Write documents' tokens as shards (ShardWriter); returns the .idx files."""
    with ShardWriter(directory, stem, vocab_size=vocab_size, tokenizer=tokenizer,
                     shard_tokens=shard_tokens) as writer:
        for ids in documents:
            writer.add(ids)
    return writer.written


@dataclass
class _Shard:
    header: ShardHeader | MegatronHeader
    tokens: np.memmap
    documents: OffsetDocuments | MegatronDocuments  # where its documents start
    start: int  # the shard's first token in the channel's stream


class TokenStream:
    """A channel's shards (smlaunch's own, or Megatron-Core's: launcher.wire.megatron_index) as one
    stream of documents, memory-mapped: `row(j, S)` reads row j."""

    def __init__(self, path: str | Path | Sequence[Path]):
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        unread = [error for p in paths for error in unindexed_tokens(p)]
        if unread:
            raise unread[0]
        indexes = [idx for p in paths for idx in shard_indexes(p)]
        if not indexes:
            raise FileNotFoundError(f"{', '.join(map(str, paths))}: no indexed token shards (*{IDX_SUFFIX})")
        self.shards: list[_Shard] = []
        start = 0
        for idx in indexes:
            header = read_header(idx)
            self.shards.append(_Shard(header, self._tokens(header), self._documents(header), start))
            start += header.tokens
        self.tokens = start
        self._starts = np.array([s.start for s in self.shards] + [start], dtype=np.int64)
        first = self.shards[0].header
        for shard in self.shards[1:]:
            if type(shard.header) is not type(first):
                raise ShardError(shard.header.idx, f"a {_format(shard.header)} beside {first.idx.name}, a "
                                 f"{_format(first)}", "keep one format in a channel (or give each its own channel "
                                                      "and mix them with data_mixture)")
            if shard.header.tokenizer != first.tokenizer or shard.header.vocab_size != first.vocab_size:
                raise ShardError(shard.header.idx, f"tokenizer {shard.header.tokenizer} (vocab_size "
                                 f"{shard.header.vocab_size}) differs from {first.idx.name}'s {first.tokenizer} "
                                 f"(vocab_size {first.vocab_size})", "pack every shard of a channel with one tokenizer")

    @staticmethod
    def _tokens(header: ShardHeader | MegatronHeader) -> np.memmap:
        if not header.tokens:
            return np.zeros(0, dtype=header.dtype)
        return np.memmap(header.bin, dtype=token_dtype(header), mode="r", shape=(header.tokens,))

    @staticmethod
    def _documents(header: ShardHeader | MegatronHeader) -> OffsetDocuments | MegatronDocuments:
        if isinstance(header, MegatronHeader):
            return MegatronDocuments(header)
        offsets = np.memmap(header.idx, dtype="<i8", mode="r", offset=header.offsets_at)
        # the ends and the order, before anything trusts them (one pass over 8 bytes a document)
        if offsets[0] != 0 or offsets[-1] != header.tokens or (np.diff(offsets) < 0).any():
            raise ShardError(header.idx, "the document offsets do not run from 0 to the shard's tokens in order",
                             "pack the data again (python -m container.data pack --format indexed)")
        return OffsetDocuments(offsets)

    @property
    def is_megatron(self) -> bool:
        return isinstance(self.header, MegatronHeader)

    @property
    def header(self) -> ShardHeader:
        return self.shards[0].header

    @property
    def max_token_id(self) -> int | None:
        """The largest id the headers record; None for Megatron's files, which record none (each row
        read is checked: IndexedSource)."""
        return None if self.is_megatron else max(s.header.max_token_id for s in self.shards)

    def rows(self, seq_len: int) -> int:
        """How many rows of seq_len tokens the stream makes (the remainder is dropped)."""
        return self.tokens // seq_len

    def row(self, index: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Row `index`: its tokens (int64, [seq_len]) and where documents start in it (bool,
        [seq_len]: its first token, and each document's first token within it)."""
        begin, end = index * seq_len, (index + 1) * seq_len
        if not 0 <= index < self.rows(seq_len):
            raise IndexError(f"row {index} of {self.rows(seq_len)}")
        tokens = np.empty(seq_len, dtype=np.int64)
        starts = np.zeros(seq_len, dtype=bool)
        first = int(np.searchsorted(self._starts, begin, side="right")) - 1
        for shard in self.shards[first:]:
            if shard.start >= end:
                break
            lo, hi = max(begin, shard.start) - shard.start, min(end, shard.start + shard.header.tokens) - shard.start
            tokens[shard.start + lo - begin:shard.start + hi - begin] = shard.tokens[lo:hi]
            starts[shard.documents.within(lo, hi) + shard.start - begin] = True
        starts[0] = True
        return tokens, starts


def _format(header: ShardHeader | MegatronHeader) -> str:
    return "Megatron-Core corpus" if isinstance(header, MegatronHeader) else "smlaunch shard"
