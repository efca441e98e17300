"""Megatron-Core corpora (format: launcher.wire.megatron_index) memory-mapped as the documents of an
indexed channel: the tokens of the .bin and where documents start in them, found from the index's
sequence offsets and document index by binary search, so a row is read in O(log sequences) as
smlaunch's own shards are (container.data.indexed), and nothing of the index is copied.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from launcher.wire.megatron_index import MegatronHeader
from launcher.wire.token_shards import ShardError

_CHUNK = 1 << 20  # sequences checked at a time: the check's memory stays ~40 MB whatever the corpus
_REBUILD = "rebuild the corpus with Megatron's preprocess_data.py, or copy both files again"


def token_dtype(header) -> str:
    """The numpy type of a shard's tokens, little-endian: <u2, <i4, ..."""
    return f"<{header.dtype[0]}{header.itemsize}"


class MegatronDocuments:
    """Where a Megatron corpus's documents start, in tokens: `within(lo, hi)` and `bounds(d)`."""

    def __init__(self, header: MegatronHeader):
        self.header, self.itemsize, self.tokens = header, header.itemsize, header.tokens
        count = header.sequences
        self.lengths = np.memmap(header.idx, dtype="<i4", mode="r", offset=header.lengths_at, shape=(count,)) \
            if count else np.zeros(0, np.int32)
        self.pointers = np.memmap(header.idx, dtype="<i8", mode="r", offset=header.pointers_at, shape=(count,)) \
            if count else np.zeros(0, np.int64)
        self.index = np.memmap(header.idx, dtype="<i8", mode="r", offset=header.document_index_at,
                               shape=(header.documents + 1,))
        self._check()

    def _check(self) -> None:
        """The sequences back to back from byte 0 (each where the previous one ends: what every
        reader here assumes) and the document index in order, one pass in chunks."""
        end = 0
        for begin in range(0, len(self.lengths), _CHUNK):
            lengths = np.asarray(self.lengths[begin:begin + _CHUNK], dtype=np.int64)
            pointers = np.asarray(self.pointers[begin:begin + _CHUNK])
            expected = end + np.concatenate([[0], np.cumsum(lengths[:-1])]) * self.itemsize
            if (lengths < 0).any() or not np.array_equal(pointers, expected):
                bad = begin + int(np.argmax((lengths < 0) | (pointers != expected)))
                raise ShardError(self.header.idx, f"sequence {bad:,} does not start where the one before it ends "
                                                  "(the offsets are not those of the lengths)", _REBUILD)
            end = int(pointers[-1]) + int(lengths[-1]) * self.itemsize
        for begin in range(0, len(self.index), _CHUNK):
            if (np.diff(np.asarray(self.index[max(begin - 1, 0):begin + _CHUNK])) < 0).any():
                raise ShardError(self.header.idx, "the document index is not in order", _REBUILD)

    def starts_of(self, documents: np.ndarray) -> np.ndarray:
        """The token where each of these documents starts (document D: the corpus's end)."""
        return self._sequence_starts(self.index[np.asarray(documents, dtype=np.int64)])

    def _sequence_starts(self, sequences: np.ndarray) -> np.ndarray:
        """The token where each of these sequences starts (sequence S: the corpus's end)."""
        sequences = np.asarray(sequences, dtype=np.int64)
        inside = sequences < len(self.pointers)
        starts = np.full(len(sequences), self.tokens, dtype=np.int64)
        starts[inside] = np.asarray(self.pointers[sequences[inside]]) // self.itemsize
        return starts

    def within(self, lo: int, hi: int) -> np.ndarray:
        """The tokens in [lo, hi) where a document starts. The arrays follow a 34-byte prefix, so
        they are not 8-byte aligned, and np.searchsorted would copy them whole at every call (2 ms
        for 2.5M documents): bisect reads the ~22 entries a search needs."""
        a, b = (bisect_left(self.pointers, value * self.itemsize) for value in (lo, hi))
        # the documents whose first sequence starts there (an empty document starts where the next does)
        c, d = (bisect_left(self.index, sequence, 0, len(self.index) - 1) for sequence in (a, b))
        return self._sequence_starts(self.index[c:d])

    def bounds(self, document: int) -> tuple[int, int]:
        """Document `document`'s tokens: [begin, end)."""
        begin, end = self.starts_of([document, document + 1])
        return int(begin), int(end)


class OffsetDocuments:
    """The same for smlaunch's own shards: their offsets are the documents' starts in tokens."""

    def __init__(self, offsets: np.ndarray):
        self.offsets = offsets

    def within(self, lo: int, hi: int) -> np.ndarray:
        doc_starts = self.offsets[:-1]  # offsets[i] for i < documents (the last offset is the end)
        a, b = np.searchsorted(doc_starts, [lo, hi])
        return np.asarray(doc_starts[a:b])

    def bounds(self, document: int) -> tuple[int, int]:
        return int(self.offsets[document]), int(self.offsets[document + 1])
