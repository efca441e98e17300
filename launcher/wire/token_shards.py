"""Indexed token shards: the binary format `python -m container.data pack --format indexed` writes,
the training job memory-maps (container.data.indexed) and `smlaunch validate` reads the headers of
(stdlib only: the client has no numpy).

A shard is two files with one stem: `<stem>.bin`, every document's tokens back to back (uint16
where the vocabulary fits, else uint32, little-endian), and `<stem>.idx`:

    8 bytes   MAGIC
    4 bytes   VERSION, uint32 little-endian
    4 bytes   n, the header's length, uint32 little-endian
    n bytes   the header: JSON, UTF-8, padded with spaces so the offsets start at a multiple of 8
    8·(D+1)   the documents' token offsets into .bin, int64 little-endian: document i is tokens
              offsets[i]:offsets[i+1]; offsets[0] = 0, offsets[D] = the shard's tokens

The header holds what a reader checks before it trusts the shard, and what the planner needs:
`dtype`, `vocab_size` (the tokenizer's), `tokenizer` ({"name", "vocabulary_sha256"}: the sha256
of the tokenizer's vocabulary, every token with its id, null for UTF-8 bytes; two tokenizers with
one digest give every id the same meaning), `documents`, `tokens`, `max_token_id`, and `lengths`:
the documents' lengths in power-of-two buckets (bucket b: lengths in [2^b, 2^(b+1))) with each
bucket's count, sum and sum of squares. A channel is every `.idx` file under its directory, in
sorted name order, as one stream of documents.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.wire import megatron_index
from launcher.wire.shard_error import BIN_SUFFIX, IDX_SUFFIX, ShardError

MAGIC = b"SMLTOKS\x00"
VERSION = 1
DTYPE_BYTES = {"uint16": 2, "uint32": 4}
_PREFIX = struct.Struct("<8sII")


def dtype_for(vocab_size: int) -> str:
    """The smallest token type that holds every id of a vocabulary of this size."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def encode_header(header: dict) -> bytes:
    """MAGIC, VERSION and the header, padded so that the offsets that follow are 8-byte aligned."""
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-(_PREFIX.size + len(text)) % 8)
    return _PREFIX.pack(MAGIC, VERSION, len(text)) + text


@dataclass(frozen=True)
class ShardHeader:
    idx: Path
    offsets_at: int  # where the int64 offsets start in the .idx file
    fields: dict

    @property
    def bin(self) -> Path:
        return self.idx.with_suffix(BIN_SUFFIX)

    @property
    def dtype(self) -> str:
        return self.fields["dtype"]

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def documents(self) -> int:
        return self.fields["documents"]

    @property
    def tokens(self) -> int:
        return self.fields["tokens"]

    @property
    def vocab_size(self) -> int:
        return self.fields["vocab_size"]

    @property
    def max_token_id(self) -> int:
        return self.fields["max_token_id"]

    @property
    def tokenizer(self) -> dict:
        return self.fields["tokenizer"]


_REPACK = "pack the data again (python -m container.data pack --format indexed)"
_REQUIRED = ("dtype", "documents", "tokens", "vocab_size", "max_token_id", "tokenizer")
_COUNTS = ("documents", "tokens", "vocab_size", "max_token_id")  # whole numbers >= 0
_SHA256_HEX = 64


def read_header(idx: str | Path):
    """The header of one shard, every field of the type and range the format gives it and checked
    against both files' sizes (a truncated, mismatched or hand-edited shard is a ShardError naming
    the file and the field), without reading the offsets or the tokens: a ShardHeader, or a
    MegatronHeader for a Megatron-Core corpus (launcher.wire.megatron_index)."""
    idx = Path(idx)
    if megatron_index.is_megatron(idx):
        return megatron_index.read_megatron_header(idx)
    try:
        with idx.open("rb") as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
                raise ShardError(idx, "not an indexed token shard (neither smlaunch's index header nor "
                                      "Megatron's MMIDIDX)", _REPACK)
            _, version, length = _PREFIX.unpack(prefix)
            if version != VERSION:
                raise ShardError(idx, f"index version {version}; this smlaunch reads version {VERSION}",
                                 "pack the data with this smlaunch")
            raw = f.read(length)
        fields = json.loads(raw) if len(raw) == length else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(idx, f"the index header cannot be read ({exc})", _REPACK) from None
    header = ShardHeader(idx, _PREFIX.size + length, _checked_fields(idx, fields))
    want_idx = header.offsets_at + 8 * (header.documents + 1)
    if os.path.getsize(idx) != want_idx:
        raise ShardError(idx, f"the index is {os.path.getsize(idx):,} bytes where its header's "
                              f"{header.documents:,} documents make {want_idx:,} (truncated or mismatched)", _REPACK)
    want_bin = header.tokens * DTYPE_BYTES[header.dtype]
    try:
        have_bin = os.path.getsize(header.bin)
    except OSError:
        raise ShardError(header.bin, f"missing: the tokens of {idx.name}", "copy both files of the shard") from None
    if have_bin != want_bin:
        raise ShardError(header.bin, f"{have_bin:,} bytes where {idx.name} says {header.tokens:,} "
                                     f"{header.dtype} tokens ({want_bin:,} bytes): truncated or mismatched",
                         _REPACK)
    return header


def _checked_fields(idx: Path, fields: object) -> dict:
    """The header's fields as the module docstring gives them: every reader (validation, the
    planner, the training job) may then use them without a type check of its own."""
    if fields is None or (isinstance(fields, dict) and any(key not in fields for key in _REQUIRED)):
        raise ShardError(idx, "the index header is truncated or incomplete", _REPACK)
    if not isinstance(fields, dict):
        raise ShardError(idx, f"the index header is a JSON {type(fields).__name__}, not an object", _REPACK)

    def refuse(key: str, want: str, value: object = None) -> ShardError:
        value = fields[key] if value is None else value
        shown = json.dumps(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return ShardError(idx, f"the index header's field {key!r} is {shown} ({_json_type(value)}), where the "
                               f"format has {want}", _REPACK)

    for key in _COUNTS:
        if not _whole(fields[key]):
            raise refuse(key, "a whole number >= 0")
    if fields["dtype"] not in DTYPE_BYTES:
        raise refuse("dtype", " or ".join(map(repr, DTYPE_BYTES)))
    if not 1 <= fields["vocab_size"] <= 2 ** (8 * DTYPE_BYTES[fields["dtype"]]):
        raise refuse("vocab_size", f"1 to {2 ** (8 * DTYPE_BYTES[fields['dtype']]):,} (the ids its dtype "
                                   f"{fields['dtype']} holds)")
    if fields["max_token_id"] >= fields["vocab_size"]:
        raise refuse("max_token_id", f"an id below the header's vocab_size {fields['vocab_size']:,}")
    tokenizer = fields["tokenizer"]
    digest = tokenizer.get("vocabulary_sha256") if isinstance(tokenizer, dict) else None
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("name"), str) or not (
            digest is None or (isinstance(digest, str) and len(digest) == _SHA256_HEX)):
        raise refuse("tokenizer", '{"name": a string, "vocabulary_sha256": 64 hex digits or null}')
    lengths = fields.get("lengths", {"buckets": []})
    buckets = lengths.get("buckets") if isinstance(lengths, dict) else None
    if not isinstance(buckets, list) or not all(
            isinstance(row, list) and len(row) == 4 and all(map(_whole, row)) and row[0] < 64 for row in buckets):
        raise refuse("lengths", '{"buckets": [[b < 64, count, sum, sum of squares], ...]} of whole numbers >= 0',
                     lengths)
    return fields


def _whole(value: object) -> bool:
    """A JSON whole number >= 0 (true and false are not numbers here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _json_type(value: object) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def shard_indexes(path: str | Path) -> list[Path]:
    """The `.idx` files of a channel (a directory, any depth, sorted by name) or a named .idx file."""
    path = Path(path)
    if path.is_file():
        return [path] if path.name.endswith(IDX_SUFFIX) else []
    if not path.is_dir():
        return []
    return sorted(f for f in path.rglob(f"*{IDX_SUFFIX}") if f.is_file())


def unindexed_tokens(path: str | Path) -> list[ShardError]:
    """A channel's `.bin` files that have no `.idx` beside them (an interrupted copy): nothing lists
    their documents, so a reader of the `.idx` files would train on fewer shards without a word.
    (A `.idx` without its `.bin` is read_header's error.)"""
    path = Path(path)
    if not path.is_dir():
        return []
    return [ShardError(f, f"no index: {f.with_suffix(IDX_SUFFIX).name} is missing beside it (an interrupted "
                          "copy?), so its tokens would not be read", "copy both files of the shard, or remove it")
            for f in sorted(path.rglob(f"*{BIN_SUFFIX}")) if f.is_file() and not f.with_suffix(IDX_SUFFIX).is_file()]


def is_indexed(path: str | Path) -> bool:
    """Whether a channel holds indexed token shards (then it is read as those, not as JSON Lines)."""
    return bool(shard_indexes(path))


def vocabulary_sha256(vocabulary: Mapping[str, int]) -> str:
    """The digest of a vocabulary: its (token, id) pairs in id order, as canonical JSON."""
    pairs = sorted(((token, int(index)) for token, index in vocabulary.items()), key=lambda p: (p[1], p[0]))
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def tokenizer_json_vocabulary(path: Path) -> dict[str, int]:
    """Every token of a `tokenizers` tokenizer.json with its id, as transformers' get_vocab()
    gives them: the model's vocabulary (a token -> id mapping, or Unigram's list of [token,
    score] in id order) and the added tokens."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    vocab = data.get("model", {}).get("vocab", {})
    mapping = dict(vocab) if isinstance(vocab, dict) else {entry[0]: i for i, entry in enumerate(vocab)}
    mapping.update({token["content"]: token["id"] for token in data.get("added_tokens") or []})
    return mapping


def tokenizer_identity(name: str, tokenizer_json: Path | None) -> dict:
    """What a shard records of its tokenizer (the header's `tokenizer`), or a job of its model's:
    None for a tokenizer without a tokenizer.json (UTF-8 bytes)."""
    digest = None
    if tokenizer_json is not None and Path(tokenizer_json).is_file():
        digest = vocabulary_sha256(tokenizer_json_vocabulary(Path(tokenizer_json)))
    return {"name": name, "vocabulary_sha256": digest}
