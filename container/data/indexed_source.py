"""Training samples from indexed token channels (container.data.indexed), in the order of
container.data.order: each channel's rows shuffled by (seed, epoch) unless `shuffle` is off, and
several channels mixed by weight (`data_mixture`). Global sample g is one row, found from g alone,
so the loader's `next_sample` resumes anywhere in O(1) at any world size.

A row is returned as the JSON Lines source returns a packed record: input_ids, shifted labels,
and, with document masking on, RoPE positions restarting at each document and the documents'
numbers (container.data.rows); so the two formats of one corpus train alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from container.data.indexed import TokenStream
from container.data.order import Mixture, Permutation
from container.data.rows import EndOfData, positions_from_starts, shift_labels, within_documents
from launcher.wire.megatron_index import FORMAT as MEGATRON_FORMAT
from launcher.wire.megatron_index import NO_TOKENIZER
from launcher.wire.token_shards import ShardError


@dataclass(frozen=True)
class Channel:
    name: str
    path: Path
    weight: float = 1.0


class IndexedSource:
    """Rows of `seq_len` tokens from indexed channels (one, or several mixed by weight)."""

    marks_documents = True  # the index knows every document's boundaries

    def __init__(self, channels: Sequence[Channel], seq_len: int, vocab_size: int, *, seed: int,
                 shuffle: bool, repeat: bool = True, document_masking: bool = True):
        if not channels:
            raise ValueError("no indexed channel given")
        if not repeat and len(channels) > 1:
            raise ValueError("a mixture repeats its data sets: it is for training, not validation")
        self.channels, self.seq_len, self.vocab_size = list(channels), seq_len, vocab_size
        self.seed, self.shuffle, self.repeat, self.document_masking = seed, shuffle, repeat, document_masking
        self.ignored_fields: dict[str, str] = {}  # shards have no record fields to ignore
        self.given_tokenizer = NO_TOKENIZER  # the job's, which a Megatron corpus is of (run_data.check_tokenizer)
        self.streams = [TokenStream(c.path) for c in self.channels]
        for channel, stream in zip(self.channels, self.streams):
            self._check(channel, stream)
        self.rows = [stream.rows(seq_len) for stream in self.streams]
        self.mixture = (Mixture([c.weight for c in self.channels], names=[c.name for c in self.channels])
                        if len(self.channels) > 1 else None)
        self._permutations: dict[tuple[int, int], Permutation] = {}

    def _check(self, channel: Channel, stream: TokenStream) -> None:
        # Megatron's files record no largest id: validate reads it where it sees them, `_sample` checks each row
        if stream.max_token_id is not None and stream.max_token_id >= self.vocab_size:
            shard = max(stream.shards, key=lambda s: s.header.max_token_id).header
            raise ShardError(shard.idx, f"token id {shard.max_token_id} outside the model's vocabulary "
                                        f"[0, {self.vocab_size}) (channel {channel.name}, tokenizer "
                                        f"{shard.tokenizer['name']})",
                             "pack the data with the model's tokenizer, or train a model of that vocabulary")
        if stream.rows(self.seq_len) == 0:
            raise ShardError(stream.header.idx, f"channel {channel.name} holds {stream.tokens:,} tokens, fewer than "
                                                f"one row of max_context_width={self.seq_len}",
                             "give it more data or a shorter max_context_width")

    def check_tokenizer(self, model: dict) -> None:
        """The shards' tokenizer against the model's (launcher.wire.token_shards.tokenizer_identity
        of both): another vocabulary's ids mean other tokens, which no range check sees."""
        if model.get("vocabulary_sha256") is None:
            return  # the job has no tokenizer.json of the model's to compare with
        for channel, stream in zip(self.channels, self.streams):
            packed = stream.header.tokenizer
            if packed is None:
                continue  # a Megatron corpus records no tokenizer: the job's is taken as its
            if packed.get("vocabulary_sha256") != model["vocabulary_sha256"]:
                what = (f"vocabulary sha256 {packed['vocabulary_sha256'][:16]}..." if packed.get("vocabulary_sha256")
                        else "its UTF-8 bytes")
                raise ShardError(stream.header.idx,
                                 f"channel {channel.name} was packed with {packed.get('name')} ({what}), whose ids "
                                 f"mean other tokens than those of the model's tokenizer {model['name']} "
                                 f"(vocabulary sha256 {model['vocabulary_sha256'][:16]}...)",
                                 "pack the data with the model's tokenizer (pack --tokenizer <the model>)")

    def describe(self) -> str:
        """One line for the job log: what is read, how much, in which order."""
        parts = []
        for channel, stream, rows in zip(self.channels, self.streams, self.rows):
            weight = f" weight {channel.weight:g}" if self.mixture is not None else ""
            kind = f"{MEGATRON_FORMAT}, " if stream.is_megatron else ""
            parts.append(f"{channel.name}{weight}: {kind}{len(stream.shards)} shard(s), {stream.tokens:,} tokens in "
                         f"{sum(s.header.documents for s in stream.shards):,} documents, {rows:,} rows of "
                         f"{self.seq_len}")
        order = f"shuffled (seed {self.seed})" if self.shuffle else "in order"
        return f"indexed token shards, {order}: " + "; ".join(parts)

    def has(self, count: int) -> bool:
        return self.repeat or count <= self.rows[0]

    def _row_of(self, data_set: int, k: int) -> int:
        n = self.rows[data_set]
        if not self.repeat and k >= n:
            raise EndOfData(f"{n} rows in channel {self.channels[data_set].name}")
        epoch, i = divmod(k, n)
        if not self.shuffle:
            return i
        key = (data_set, epoch)
        if key not in self._permutations:
            if len(self._permutations) > 8:  # a loader moves forward: old epochs are not asked again
                self._permutations.clear()
            # each data set its own stream of the seed; every epoch its own order
            self._permutations[key] = Permutation(n, seed=self.seed * 1_000_003 + data_set, epoch=epoch)
        return int(self._permutations[key]([i])[0])

    def read(self, start: int, count: int) -> dict[str, torch.Tensor]:
        samples = np.arange(start, start + count, dtype=np.int64)
        if self.mixture is not None:
            data_sets, ks = self.mixture.locate(samples)
        else:
            data_sets, ks = np.zeros_like(samples), samples
        rows = [self._sample(int(d), int(k)) for d, k in zip(data_sets, ks)]
        return {key: torch.stack([r[key] for r in rows]) for key in rows[0]}

    def _sample(self, data_set: int, k: int) -> dict[str, torch.Tensor]:
        row = self._row_of(data_set, k)
        tokens, starts = self.streams[data_set].row(row, self.seq_len)
        if tokens.max() >= self.vocab_size or tokens.min() < 0:
            stream = self.streams[data_set]
            bad = int(tokens.min()) if tokens.min() < 0 else int(tokens.max())
            said = ("(the corpus was tokenized for another vocabulary)" if stream.is_megatron else
                    "although the header says otherwise (a damaged .bin)")
            raise ShardError(stream.header.idx, f"row {row} of channel {self.channels[data_set].name} holds token id "
                                                f"{bad} outside the vocabulary [0, {self.vocab_size}) {said}",
                             "train a model of the corpus's vocabulary (vocab_size, tokenizer)" if stream.is_megatron
                             else "pack the data again")
        ids = torch.from_numpy(tokens)
        labels = shift_labels(ids)
        if not self.document_masking:  # the seed's behaviour: rows are single sequences
            return {"input_ids": ids, "labels": labels}
        starts = torch.from_numpy(starts)
        return {"input_ids": ids, "labels": labels, "positions": positions_from_starts(starts),
                **within_documents(labels, starts)}
