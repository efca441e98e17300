"""Training rows of chat and instruction examples (`dataset_type: chat`; container.data.chat makes
the examples): truncated by the job's policy, packed best-fit into rows of exactly
max_context_width tokens without splitting one, each example its own document.

Every rank reads and tokenizes the whole channel and packs it the same way (the packing is a
function of the examples alone): fine-tuning sets are small, and this way no rank waits for
another's tokens. A rank keeps only the examples' tokens and labels (8 bytes a token) and the
rows' lists of examples; a row is put together when read.

- Too long (more than max_context_width tokens): `truncation_mode` keep_start (TRL's default:
  the first max_context_width tokens), keep_end (the last), or drop. An example whose kept part
  trains no token is dropped. The job log counts both.
- Packing: best-fit decreasing (longest example first, into the row it fills most tightly, a new
  row where none has room); the rest of a row is padding, a document of its own with no target.
- Rows are returned as the other sources return them (container.data.rows): shifted labels, and
  with document masking (on by default) RoPE positions restarting at each example and the
  examples' document numbers, so packed examples never see each other and each trains as it
  would alone. An example's last token predicts nothing.
- Order: global sample i is row i mod N of epoch i div N; shuffled (the default for chat) by
  container.data.order's Permutation(N, seed, epoch), each epoch anew.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from container.data.chat import ChatTokenizer, Example, check_vocabulary
from container.data.order import Permutation
from container.data.rows import IGNORE_INDEX, EndOfData, positions_from_starts, shift_labels, within_documents
from launcher.wire.chat_records import read_records

TRUNCATION_MODES = ("keep_start", "keep_end", "drop")


def truncate(example: Example, seq_len: int, mode: str) -> Example | None:
    """The part of `example` a row of `seq_len` tokens keeps: all of it when it fits, else by
    `mode`; None when nothing trainable is kept (`drop`, or no trained token in the kept part)."""
    if len(example.input_ids) <= seq_len:
        return example
    if mode == "drop":
        return None
    cut = slice(None, seq_len) if mode == "keep_start" else slice(-seq_len, None)
    kept = Example(example.input_ids[cut], example.labels[cut], example.where)
    return kept if kept.trained else None


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each holding at most `capacity` in all: items longest first (ties by
    index), each into the open bin whose room it fills most tightly, else a new bin.
    Deterministic: the same lengths give the same bins on every rank."""
    rooms: list[tuple[int, int]] = []  # (room left, bin), sorted
    bins: list[list[int]] = []
    for item in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[item]
        if length > capacity:
            raise ValueError(f"item {item} of length {length} exceeds the capacity {capacity}")
        at = bisect.bisect_left(rooms, (length, -1))
        if at < len(rooms):
            room, b = rooms.pop(at)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(item)
        if room - length:
            bisect.insort(rooms, (room - length, b))
    return bins


@dataclass
class Counts:
    """What the job log says of a chat channel."""

    examples: int = 0  # records read
    truncated: int = 0
    dropped_long: int = 0  # longer than a row, truncation_mode drop
    dropped_untrained: int = 0  # truncated to a part with nothing to train
    tokens: int = 0  # of the kept examples
    trained: int = 0
    rows: int = 0
    padding: int = 0


def keep(example: Example, seq_len: int, mode: str, counts: Counts) -> Example | None:
    """What a row of `seq_len` tokens keeps of `example` (truncate), counted into `counts` as the
    job log counts it (python -m container.data inspect counts with it too)."""
    counts.examples += 1
    cut = truncate(example, seq_len, mode)
    if len(example.input_ids) > seq_len:
        if cut is not None:
            counts.truncated += 1
        elif mode == "drop":
            counts.dropped_long += 1
        else:
            counts.dropped_untrained += 1
    if cut is not None:
        counts.tokens += len(cut.input_ids)
        counts.trained += cut.trained
    return cut


class ChatSource:
    """Rows of `seq_len` tokens packed from the chat examples of `files` (see the module docstring)."""

    marks_documents = True  # every example is a document

    def __init__(self, files: Sequence[Path], tokenizer: ChatTokenizer, seq_len: int, vocab_size: int, *,
                 seed: int, shuffle: bool, truncation_mode: str = "keep_start", repeat: bool = True,
                 document_masking: bool = True, name: str = "train"):
        if truncation_mode not in TRUNCATION_MODES:
            raise ValueError(f"truncation_mode must be one of {', '.join(TRUNCATION_MODES)}, not {truncation_mode!r}")
        if not files:
            raise FileNotFoundError("no data files given")
        self.files, self.tokenizer, self.seq_len, self.name = list(files), tokenizer, seq_len, name
        self.seed, self.shuffle, self.truncation_mode, self.repeat = seed, shuffle, truncation_mode, repeat
        self.document_masking = document_masking
        self.ignored_fields: dict[str, str] = {}  # metadata field -> where it was first seen
        self.counts = Counts()
        self.pad_token_id = tokenizer.pad_token_id
        examples = self._examples(vocab_size)
        if not examples:
            raise ValueError(f"no chat example of {', '.join(map(str, self.files))} fits a row of "
                             f"max_context_width={seq_len} with a token to train on ({self.counts.examples} read: "
                             f"{self.counts.dropped_long} longer, dropped by truncation_mode {truncation_mode}, "
                             f"{self.counts.dropped_untrained} with nothing to train once truncated): raise "
                             "max_context_width or use truncation_mode keep_start")
        lengths = [len(e.input_ids) for e in examples]
        self.rows = best_fit_decreasing(lengths, seq_len)
        # every kept example's tokens and labels back to back; the rows name examples
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # int32: 8 bytes a token with its label (ids and -100 fit), a quarter of Python's lists
        self.tokens = np.fromiter((t for e in examples for t in e.input_ids), np.int32, count=int(self.offsets[-1]))
        self.labels = np.fromiter((t for e in examples for t in e.labels), np.int32, count=int(self.offsets[-1]))
        self.counts.rows = len(self.rows)
        self.counts.padding = len(self.rows) * seq_len - int(self.offsets[-1])
        self._permutations: dict[int, Permutation] = {}

    def _examples(self, vocab_size: int) -> list[Example]:
        kept, counts = [], self.counts
        for where, record in read_records(self.files):
            example = self.tokenizer.example(record, where)
            check_vocabulary(example, vocab_size, self.tokenizer.name)
            for field in record:
                if field not in ("messages", "prompt", "completion"):
                    self.ignored_fields.setdefault(field, where)
            cut = keep(example, self.seq_len, self.truncation_mode, counts)
            if cut is not None:
                kept.append(cut)
        return kept

    def describe(self) -> str:
        """One line for the job log: what was read, what truncation did, how the rows are filled."""
        c = self.counts
        long = c.truncated + c.dropped_long + c.dropped_untrained
        order = (f"shuffled (seed {self.seed})" if self.shuffle else "in order")
        return (f"chat examples of {self.name}, {order}: {c.examples:,} examples in {len(self.files)} file(s), "
                f"tokenized with the tokenizer of {self.tokenizer.name}; {long:,} longer than "
                f"max_context_width={self.seq_len} (truncation_mode {self.truncation_mode}): {c.truncated:,} "
                f"truncated, {c.dropped_long + c.dropped_untrained:,} dropped ({c.dropped_long:,} by the policy, "
                f"{c.dropped_untrained:,} with nothing left to train); {c.tokens:,} tokens, {c.trained:,} trained, "
                f"packed best-fit into {c.rows:,} rows of {self.seq_len} (padding {self.padding_share:.1%})")

    def epochs(self, steps: int, rows_per_step: int) -> str:
        """One line for the job log: how many passes over the rows `steps` steps of `rows_per_step`
        rows (micro-batch x gradient accumulation x data-parallel ranks) make."""
        read = steps * rows_per_step
        return (f"{steps:,} step(s) of {rows_per_step:,} rows read {read:,} rows: {read / len(self.rows):.3g} "
                f"epoch(s) of the {len(self.rows):,} rows of chat examples of {self.name}")

    @property
    def padding_share(self) -> float:
        return self.counts.padding / (self.counts.rows * self.seq_len)

    def has(self, count: int) -> bool:
        return self.repeat or count <= len(self.rows)

    def _row_of(self, sample: int) -> int:
        n = len(self.rows)
        if not self.repeat and sample >= n:
            raise EndOfData(f"{n} rows of chat examples in {self.name}")
        epoch, i = divmod(sample, n)
        if not self.shuffle:
            return i
        if epoch not in self._permutations:
            if len(self._permutations) > 8:  # a loader moves forward: old epochs are not asked again
                self._permutations.clear()
            self._permutations[epoch] = Permutation(n, seed=self.seed, epoch=epoch)
        return int(self._permutations[epoch]([i])[0])

    def row(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row `index`'s tokens, labels before the shift, and where its documents start."""
        ids = np.full(self.seq_len, self.pad_token_id, dtype=np.int64)
        labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        starts = np.zeros(self.seq_len, dtype=bool)
        at = 0
        for example in self.rows[index]:
            begin, end = self.offsets[example], self.offsets[example + 1]
            ids[at:at + end - begin] = self.tokens[begin:end]
            labels[at:at + end - begin] = self.labels[begin:end]
            starts[at] = True
            at += end - begin
        if at < self.seq_len:
            starts[at] = True  # the padding: a document of its own
        return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(starts)

    def read(self, start: int, count: int) -> dict[str, torch.Tensor]:
        samples = [self._sample(self._row_of(i)) for i in range(start, start + count)]
        return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}

    def _sample(self, index: int) -> dict[str, torch.Tensor]:
        ids, labels, starts = self.row(index)
        labels = shift_labels(labels)
        if not self.document_masking:  # document_masking=0: packed examples see each other
            return {"input_ids": ids, "labels": labels}
        return {"input_ids": ids, "labels": labels, "positions": positions_from_starts(starts),
                **within_documents(labels, starts)}
