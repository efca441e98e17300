"""Megatron-Core's indexed corpora (`MMIDIDX`), read where they are: the layout of the `.idx` file
Megatron's IndexedDatasetBuilder and preprocess_data.py write, checked against both files' sizes
(stdlib only: `smlaunch validate` reads these headers on the client, which has no numpy).

    9 bytes   MAGIC (b"MMIDIDX\\x00\\x00")
    8 bytes   version, uint64 little-endian: 1
    1 byte    the tokens' dtype code (DTYPES; 6 and 7 are float64 and float32: not token ids)
    8 bytes   S, the sequences, uint64
    8 bytes   D + 1, the document index's entries, uint64
    4·S       each sequence's length in tokens, int32
    8·S       each sequence's byte offset into .bin, int64
    8·(D+1)   the document index, int64: document d is sequences [index[d], index[d+1]),
              index[0] = 0, index[D] = S
   (S bytes   each sequence's mode, int8: multimodal corpora only, not read here)

A smlaunch document is one of Megatron's documents: its sequences' tokens back to back (a corpus
preprocessed without --split-sentences has one sequence a document). The files carry no tokenizer
and no vocabulary size: the job supplies them, and its largest token id is found by reading the
.bin (`token_range`).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

from launcher.wire.shard_error import BIN_SUFFIX, ShardError

# Imports inside functions: s3io only where the client peeks at a corpus on S3 (a training rank,
# which reads corpora here, loads few launcher modules).
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron's DType codes: every integer type it writes, with its size and the stdlib array code
DTYPES = {1: ("uint8", 1, "B"), 2: ("int8", 1, "b"), 3: ("int16", 2, "h"), 4: ("int32", 4, "i"),
          5: ("int64", 8, "q"), 8: ("uint16", 2, "H")}
FLOAT_DTYPES = {6: "float64", 7: "float32"}
_PREFIX = struct.Struct("<9sQBQQ")
# what a checkpoint records as a Megatron corpus's tokenizer when the job names none (vocab_size alone)
NO_TOKENIZER = {"name": "no tokenizer named (vocab_size)", "vocabulary_sha256": None}
FORMAT = "Megatron MMIDIDX v1"
_REBUILD = "rebuild the corpus with Megatron's preprocess_data.py (or IndexedDatasetBuilder), or copy both files again"


def encode_prefix(dtype: str, sequences: int, documents: int) -> bytes:
    """The 34 bytes an index starts with (the arrays follow): what `pack --format megatron` writes."""
    code = next(code for code, (name, _, _) in DTYPES.items() if name == dtype)
    return _PREFIX.pack(MAGIC, VERSION, code, sequences, documents + 1)


def is_megatron(idx: str | Path) -> bool:
    """Whether an .idx file starts with Megatron's magic."""
    try:
        with open(idx, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def megatron_on_s3(s3_client, uri: str) -> str | None:
    """The key of the first .idx under the s3:// prefix `uri` (a channel; any depth, in name order)
    when it starts with Megatron's magic, read by one ranged GET of its first bytes; None when the
    prefix holds no .idx or smlaunch's (a channel holds one format). `s3_client`: boto3's; its
    ClientError (no such bucket, access denied) is the caller's."""
    from launcher.wire import s3io

    bucket, prefix = s3io.split(uri)
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = sorted(o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".idx"))
        if keys:
            head = s3_client.get_object(Bucket=bucket, Key=keys[0], Range=f"bytes=0-{len(MAGIC) - 1}")["Body"].read()
            return keys[0] if head == MAGIC else None
    return None


@dataclass(frozen=True)
class MegatronHeader:
    """One Megatron .idx/.bin pair, checked: what a reader needs and where the arrays are."""

    idx: Path
    dtype: str
    sequences: int
    documents: int
    tokens: int

    @property
    def bin(self) -> Path:
        return self.idx.with_suffix(BIN_SUFFIX)

    @property
    def itemsize(self) -> int:
        return next(size for name, size, _ in DTYPES.values() if name == self.dtype)

    @property
    def lengths_at(self) -> int:
        return _PREFIX.size

    @property
    def pointers_at(self) -> int:
        return _PREFIX.size + 4 * self.sequences

    @property
    def document_index_at(self) -> int:
        return self.pointers_at + 8 * self.sequences

    # what smlaunch's own shard header records and these files do not: the job supplies the tokenizer
    # and the vocabulary, and the largest id is found by reading the tokens (token_range)
    tokenizer = vocab_size = max_token_id = None

    @property
    def fields(self) -> dict:
        return {}  # no header fields: the lengths are read from the index (length_buckets)

    def describe(self) -> str:
        return f"{FORMAT}, {self.dtype}, {self.documents:,} documents, {_short(self.tokens)} tokens"


def _short(count: int) -> str:
    for size, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


def read_megatron_header(idx: str | Path) -> MegatronHeader:
    """The header of one Megatron .idx file, checked against its size and its .bin's (a truncated
    file, a missing .bin, a float or unknown dtype, a multimodal index: a ShardError naming the
    file), reading 34 bytes and four numbers of the arrays."""
    idx = Path(idx)
    try:
        with idx.open("rb") as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) < _PREFIX.size or prefix[:len(MAGIC)] != MAGIC:
                raise ShardError(idx, f"not a {FORMAT} index (its header is truncated)", _REBUILD)
            _, version, code, sequences, entries = _PREFIX.unpack(prefix)
            if version != VERSION:
                raise ShardError(idx, f"Megatron index version {version}; smlaunch reads version {VERSION}", _REBUILD)
            if code in FLOAT_DTYPES:
                raise ShardError(idx, f"its tokens are {FLOAT_DTYPES[code]} (dtype code {code}), not token ids",
                                 "tokenize the corpus into an integer dtype (uint16 or int32, as preprocess_data.py "
                                 "writes)")
            if code not in DTYPES:
                raise ShardError(idx, f"dtype code {code} is none of Megatron's ({_codes()})", _REBUILD)
            header = MegatronHeader(idx, DTYPES[code][0], sequences, max(entries - 1, 0), 0)
            want = header.document_index_at + 8 * entries
            size = os.path.getsize(idx)
            if size == want + sequences and sequences:
                raise ShardError(idx, "a multimodal index (sequence modes follow the document index): its "
                                      "sequences are not all text tokens", "give a text-only corpus")
            if size != want or entries < 1:
                raise ShardError(idx, f"the index is {size:,} bytes where its {sequences:,} sequences and "
                                      f"{entries:,} document entries make {want:,} (truncated or mismatched)", _REBUILD)
            first_doc, last_doc = _read_at(f, header.document_index_at, "<q"), _read_at(f, want - 8, "<q")
            if first_doc != 0 or last_doc != sequences:
                raise ShardError(idx, f"the document index runs from sequence {first_doc} to {last_doc}, not from 0 "
                                      f"to its {sequences:,} sequences", _REBUILD)
            end = (_read_at(f, header.document_index_at - 8, "<q") +
                   header.itemsize * _read_at(f, header.pointers_at - 4, "<i")) if sequences else 0
    except OSError as exc:
        raise ShardError(idx, f"cannot be read ({exc.strerror or exc})", _REBUILD) from None
    return _with_tokens(header, end)


def _with_tokens(header: MegatronHeader, end: int) -> MegatronHeader:
    """The header with its token count, once the .bin is there and of the size the index says."""
    try:
        have = os.path.getsize(header.bin)
    except OSError:
        raise ShardError(header.bin, f"missing: the tokens of {header.idx.name}", "copy both files of the corpus") \
            from None
    if have != end:
        raise ShardError(header.bin, f"{have:,} bytes where {header.idx.name} says its sequences end at byte "
                                     f"{end:,} ({header.dtype}): truncated or mismatched", _REBUILD)
    return MegatronHeader(header.idx, header.dtype, header.sequences, header.documents, end // header.itemsize)


def _read_at(f, offset: int, fmt: str) -> int:
    f.seek(offset)
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _codes() -> str:
    return ", ".join(f"{code} {name}" for code, (name, _, _) in sorted(DTYPES.items()))


def token_range(header: MegatronHeader, chunk_tokens: int = 1 << 26) -> tuple[int, int]:
    """(smallest, largest) token id of the .bin, read in chunks: memory-mapped by numpy where it is
    installed (10 GB in ~2 s from the page cache), else by the stdlib's array (the same answer,
    ~50 times slower); (0, 0) for an empty corpus."""
    if not header.tokens:
        return 0, 0
    try:
        import numpy as np
    except ImportError:
        return _stdlib_range(header, chunk_tokens)
    tokens = np.memmap(header.bin, dtype=f"<{header.dtype[0]}{header.itemsize}", mode="r", shape=(header.tokens,))
    ranges = [(int(c.min()), int(c.max())) for c in (tokens[i:i + chunk_tokens]
                                                     for i in range(0, header.tokens, chunk_tokens))]
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _stdlib_range(header: MegatronHeader, chunk_tokens: int) -> tuple[int, int]:
    code = next(c for name, _, c in DTYPES.values() if name == header.dtype)
    low, high = None, None
    with header.bin.open("rb") as f:
        while chunk := f.read(chunk_tokens * header.itemsize):
            values = array(code, chunk)
            if sys.byteorder == "big":
                values.byteswap()
            low = min(values) if low is None else min(low, min(values))
            high = max(values) if high is None else max(high, max(values))
    return low, high


def length_buckets(header: MegatronHeader, chunk: int = 1 << 16) -> list[list[int]]:
    """The documents' lengths as smlaunch's shard header keeps them (`lengths.buckets`: [b, count,
    sum, sum of squares] of the lengths in [2^b, 2^(b+1)), 0 and 1 in bucket 0), read from the
    index a chunk of documents at a time (their first sequences' offsets: never the tokens); numpy
    where installed (2.5M documents in 0.2 s), else the stdlib (~30 s)."""
    try:
        import numpy as np
    except ImportError:
        np = None
    rows: dict[int, list[int]] = {}
    with header.idx.open("rb") as f:
        for begin in range(0, header.documents, chunk):
            lengths = _document_lengths(f, header, begin, min(begin + chunk, header.documents), np)
            for b, count, total, squares in (_numpy_rows(np, lengths) if np is not None else _rows(lengths)):
                row = rows.setdefault(b, [0, 0, 0])
                row[0], row[1], row[2] = row[0] + count, row[1] + total, row[2] + squares
    return [[b, *rows[b]] for b in sorted(rows)]


def _rows(lengths: list[int]) -> list[tuple[int, int, int, int]]:
    rows: dict[int, list[int]] = {}
    for length in lengths:
        row = rows.setdefault(max(length, 1).bit_length() - 1, [0, 0, 0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + length, row[2] + length * length
    return [(b, *row) for b, row in rows.items()]


def _numpy_rows(np, lengths: list[int]) -> list[tuple[int, int, int, int]]:
    values = np.asarray(lengths, dtype=np.int64)
    buckets = np.frexp(np.maximum(values, 1))[1] - 1  # the bit length - 1, exactly
    rows = []
    for b in np.unique(buckets):
        inside = values[buckets == b]
        # int64 squares sum exactly while a chunk's 2^16 documents stay under 2^23 tokens each
        squares = int(inside @ inside) if b < 23 else sum(int(v) * int(v) for v in inside)
        rows.append((int(b), len(inside), int(inside.sum()), squares))
    return rows


def _int64s(f, offset: int, count: int) -> array:
    f.seek(offset)
    values = array("q", f.read(8 * count))
    if sys.byteorder == "big":
        values.byteswap()
    return values


def _document_lengths(f, header: MegatronHeader, begin: int, end: int, np=None):
    """The lengths in tokens of documents [begin, end): the next one's first token minus its own."""
    firsts = _int64s(f, header.document_index_at + 8 * begin, end - begin + 1)  # and the next's
    low, high = firsts[0], min(firsts[-1], header.sequences - 1)
    pointers = _int64s(f, header.pointers_at + 8 * low, high - low + 1) if high >= low else array("q")
    if np is not None:
        firsts, pointers = np.asarray(firsts), np.asarray(pointers)
        inside = firsts < header.sequences
        starts = np.full(len(firsts), header.tokens, dtype=np.int64)
        starts[inside] = pointers[firsts[inside] - low] // header.itemsize
        return np.diff(starts)
    starts = [pointers[s - low] // header.itemsize if s < header.sequences else header.tokens for s in firsts]
    return [b - a for a, b in zip(starts, starts[1:])]


def fingerprint(header: MegatronHeader, window: int = 1 << 16) -> str:
    """A cheap identity of a corpus's content (the files' sizes are recorded beside it): the sha256
    of the first and last `window` bytes of both files, so a rebuilt corpus of the same sizes is
    told apart without reading terabytes."""
    digest = hashlib.sha256()
    for path in (header.idx, header.bin):
        with path.open("rb") as f:
            digest.update(f.read(window))
            f.seek(max(os.path.getsize(path) - window, 0))
            digest.update(f.read(window))
    return digest.hexdigest()
