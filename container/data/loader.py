"""Training data: fixed-length token blocks in a global order that no parallelism changes.

Sample i of the global order is record i mod N of the channel's files (read in sorted name
order, as one stream, epoch after epoch), for `dataset_type="indexed"` a row of the channels'
token shards found from i alone (shuffled with the seed, mixed by weight:
container.data.indexed_source), for `dataset_type="chat"` a row of chat examples packed with the
model's chat template (container.data.chat_source), or, for `dataset_type="synthetic"`, a
deterministic function of (seed, i). Step s consumes global samples [start + s·G, start + (s+1)·G) with
G = micro_batch × dp_size × grad_accum. Data-parallel rank d takes the contiguous slice
[d·m·a, (d+1)·m·a) of it (m = micro_batch, a = grad_accum) and its k-th micro-batch is the k-th
m-sized piece of that slice. Every (rank, micro-batch) pair covers a distinct part of the step's
G samples, so the step sees the same samples as one rank with a G-sized batch, whatever the
world size; context- and tensor-parallel ranks of one data-parallel rank get the same batch.

Labels are shifted here, before context parallelism cuts sequences: labels[:, t] is the token
at t+1 (or the record's own label at t+1), -100 (ignored by the loss) at the last position
and where the record's attention_mask marks the target as padding.

Documents (docs/data.md): a record whose `position_ids` restart at 0 marks where each of its
documents starts (Hugging Face's DataCollatorWithFlattening writes them so). With document
masking on (the default; hyperparameter document_masking=0 turns it off), its batch carries
`positions` (RoPE positions restarting at each document) and `documents` (each token's document
in the row, for the attention mask), and the last token of a document predicts nothing: a packed
row then trains exactly as its documents alone. Every field of a record is used, refused or
ignored by name (launcher.wire.datafiles' `USED_FIELDS`, `REFUSED_FIELDS`): one that would
change how a record trains is never skipped quietly.

Data sets are made by container.data.packing (`pack`, the seed's `group_texts`), also as

    python -m container.data pack --input docs/ src/ --output train.jsonl --block-size 512
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from container.data.chat import ChatTokenizer
from container.data.chat_source import ChatSource
from container.data.indexed_source import Channel, IndexedSource
from container.data.rows import IGNORE_INDEX, EndOfData, shift_labels, within_documents
from launcher.wire.chat_records import chat_files
from launcher.wire.datafiles import USED_FIELDS, data_files, open_text, refused_field
from launcher.wire.token_shards import is_indexed


class JsonlSource:
    """Records of JSON Lines files as one stream, read line by line (never a whole file).

    Reads move forward only, skipping other ranks' lines unparsed; asking for an earlier sample
    restarts the stream. With `repeat`, sample i is record i mod N (N is learnt at the first
    end of the data); without, reading past the end raises EndOfData.
    """

    def __init__(self, files: Sequence[Path], seq_len: int, vocab_size: int, repeat: bool = True,
                 document_masking: bool = True):
        if not files:
            raise FileNotFoundError("no data files given")
        self.files, self.seq_len, self.vocab_size, self.repeat = list(files), seq_len, vocab_size, repeat
        self.document_masking = document_masking
        self.num_records: int | None = None
        self.ignored_fields: dict[str, str] = {}  # metadata field -> where it was first seen
        self.marks_documents = False  # whether a record read so far had position_ids
        self._lines: Iterator[tuple[Path, int, str]] | None = None
        self._pos = 0  # global index of the sample the stream yields next

    def _read_lines(self) -> Iterator[tuple[Path, int, str]]:
        count = 0
        for path in self.files:
            with open_text(path) as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        count += 1
                        yield path, lineno, line
        self.num_records = count
        if count == 0:
            raise ValueError(f"no records in {', '.join(map(str, self.files))}")

    def _next_line(self) -> tuple[Path, int, str] | None:
        """The next record's line, or None at the end of the data (the stream then starts over)."""
        if self._lines is None:
            self._lines = self._read_lines()
        line = next(self._lines, None)
        if line is None:
            if not self.repeat:  # the spent iterator stays: asking again raises again
                raise EndOfData(f"{self._pos} records in {', '.join(map(str, self.files))}")
            self._lines = None
            return None
        self._pos += 1
        return line

    def _seek(self, index: int) -> None:
        if index < self._pos:
            self._lines, self._pos = None, 0
        while self._pos < index:
            if self._lines is None and self.repeat and self.num_records:
                self._pos += (index - self._pos) // self.num_records * self.num_records  # whole epochs
                if self._pos == index:
                    break
            self._next_line()

    def has(self, count: int) -> bool:
        """Whether samples [0, count) exist (always, when repeating)."""
        try:
            if count > self._pos:
                self._seek(count)
            return True
        except EndOfData:
            return False

    def read(self, start: int, count: int) -> dict[str, torch.Tensor]:
        """The batch of samples start..start+count-1: input_ids and shifted labels, [count,
        seq_len] each, and positions and documents where document masking applies."""
        self._seek(start)
        rows = []
        while len(rows) < count:
            line = self._next_line()
            if line is not None:
                rows.append(self._parse(*line))
        if not any("positions" in r for r in rows):
            return {key: torch.stack([r[key] for r in rows]) for key in ("input_ids", "labels")}
        whole = {"positions": torch.arange(self.seq_len), "documents": torch.zeros(self.seq_len, dtype=torch.long)}
        return {key: torch.stack([r.get(key, whole.get(key)) for r in rows])
                for key in ("input_ids", "labels", "positions", "documents")}

    def _parse(self, path: Path, lineno: int, line: str) -> dict[str, torch.Tensor]:
        where = f"{path}:{lineno}"
        expected = f"{where}: expected a JSON object with an integer list 'input_ids'"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{expected} ({e})") from e
        if isinstance(record, dict):  # first: a refused field says what the record is (chat: dataset_type chat)
            self._check_fields(record, where)
        try:
            ids = torch.tensor(record["input_ids"], dtype=torch.long)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{expected} ({e})") from e
        if ids.ndim != 1 or len(ids) != self.seq_len:
            raise ValueError(
                f"{where}: input_ids has {len(ids) if ids.ndim == 1 else tuple(ids.shape)} tokens, "
                f"expected max_context_width={self.seq_len}. Blocks must be fixed-length: "
                f"re-block the data (python -m container.data pack --block-size {self.seq_len}) "
                f"or set max_context_width to the data's block size")
        outside = ids[(ids < 0) | (ids >= self.vocab_size)]
        if len(outside):
            raise ValueError(f"{where}: token id {int(outside[0])} outside the vocabulary "
                             f"[0, {self.vocab_size})")
        labels = ids
        if "labels" in record:
            labels = torch.tensor(record["labels"], dtype=torch.long)
            if labels.shape != ids.shape:
                raise ValueError(f"{where}: labels has {len(labels)} entries, input_ids {len(ids)}")
        labels = shift_labels(labels)
        if "attention_mask" in record:
            # A padded target (mask 0) is not something to learn to predict.
            mask = torch.tensor(record["attention_mask"], dtype=torch.bool)
            if mask.shape != ids.shape:
                raise ValueError(f"{where}: attention_mask has {len(mask)} entries, input_ids {len(ids)}")
            labels[:-1][~mask[1:]] = IGNORE_INDEX
        out = {"input_ids": ids, "labels": labels}
        if "position_ids" in record:
            positions = _positions(record["position_ids"], len(ids), where)
            self.marks_documents = True
            if self.document_masking:
                out.update(positions=positions, **within_documents(labels, positions == 0))
        return out

    def _check_fields(self, record: dict, where: str) -> None:
        refused = refused_field(record, where)
        if refused:
            raise ValueError(": ".join(refused))
        for name in record:
            if name not in USED_FIELDS:
                self.ignored_fields.setdefault(name, where)


def _positions(value, length: int, where: str) -> torch.Tensor:
    """A record's position_ids: 0 at each document's first token, then counting up by one."""
    try:
        positions = torch.tensor(value, dtype=torch.long)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: position_ids must be a list of integers ({e})") from e
    if positions.shape != (length,):
        raise ValueError(f"{where}: position_ids has shape {tuple(positions.shape)}, input_ids ({length},): "
                         "give one position per token")
    steps_on = positions[1:] == positions[:-1] + 1
    wrong = ((positions[1:] != 0) & ~steps_on).nonzero()
    if positions[0] != 0 or len(wrong):
        at = 0 if positions[0] != 0 else int(wrong[0]) + 1
        raise ValueError(f"{where}: position_ids[{at}] is {int(positions[at])}: position_ids start at 0 "
                         "and restart at 0 at each document, else count up by one (Hugging Face's "
                         "DataCollatorWithFlattening convention)")
    return positions


class SyntheticSource:
    """Sample i is a function of (seed, i, stream) only: cheap, endless and rank-independent.

    Each sample is an arithmetic progression modulo the vocabulary with a random start and a
    random stride in [1, 8), so a model can learn it (the loss falls, which random tokens would
    not show) while every sample differs.
    """

    def __init__(self, seq_len: int, vocab_size: int, seed: int, stream: int = 0):
        self.seq_len, self.vocab_size, self.seed, self.stream = seq_len, vocab_size, seed, stream

    def has(self, count: int) -> bool:
        return True

    def sample(self, index: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, self.stream, index])
        start, stride = int(rng.integers(0, self.vocab_size)), int(rng.integers(1, 8))
        return (start + stride * torch.arange(self.seq_len, dtype=torch.long)) % self.vocab_size

    def read(self, start: int, count: int) -> dict[str, torch.Tensor]:
        ids = torch.stack([self.sample(i) for i in range(start, start + count)])
        return {"input_ids": ids, "labels": shift_labels(ids)}


Source = JsonlSource | SyntheticSource | IndexedSource | ChatSource


class TrainLoader:
    """Training micro-batches of one data-parallel rank, in the global order described above.

    Call `next_batch()` grad_accum times per step. `state_dict()` (between steps) holds the
    global index of the next step's first sample; it does not depend on the world size, so a
    run may resume with other parallelism degrees.
    """

    def __init__(self, source: Source, *, micro_batch_size: int, dp_rank: int, dp_size: int,
                 grad_accum: int = 1, start_sample: int = 0):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        if micro_batch_size < 1 or grad_accum < 1:
            raise ValueError("micro_batch_size and grad_accum must be >= 1")
        self.source = source
        self.micro_batch_size, self.dp_rank, self.dp_size, self.grad_accum = (
            micro_batch_size, dp_rank, dp_size, grad_accum)
        self.global_batch_size = micro_batch_size * dp_size * grad_accum
        self._step_start, self._micro = start_sample, 0

    def next_batch(self) -> dict[str, torch.Tensor]:
        m = self.micro_batch_size
        first = self._step_start + self.dp_rank * m * self.grad_accum + self._micro * m
        batch = self.source.read(first, m)
        self._micro += 1
        if self._micro == self.grad_accum:
            self._step_start += self.global_batch_size
            self._micro = 0
        return batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict[str, int]:
        if self._micro:
            raise RuntimeError(f"data state taken after {self._micro} of {self.grad_accum} micro-batches; "
                               "take it between optimizer steps")
        return {"next_sample": self._step_start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._step_start, self._micro = int(state["next_sample"]), 0


class ValidationLoader:
    """The first `max_batches` global batches of a validation channel (all of it when None or
    negative, the seed's `validation_batches -1`), from sample 0 on every pass; each rank takes
    its contiguous micro_batch slice. A last global batch that is not complete is left out, so
    every rank runs the same number of batches (the loss reduction is a collective)."""

    def __init__(self, source: Source, *, micro_batch_size: int, dp_rank: int, dp_size: int,
                 max_batches: int | None = None):
        max_batches = None if max_batches is None or max_batches < 0 else max_batches
        if max_batches is None and isinstance(source, SyntheticSource):
            raise ValueError("synthetic validation data is endless: give max_batches")
        self.source, self.micro_batch_size, self.dp_rank, self.dp_size, self.max_batches = (
            source, micro_batch_size, dp_rank, dp_size, max_batches)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        m, g = self.micro_batch_size, self.micro_batch_size * self.dp_size
        b = 0
        while self.max_batches is None or b < self.max_batches:
            try:
                batch = self.source.read(b * g + self.dp_rank * m, m)
            except EndOfData:
                return
            if not self.source.has((b + 1) * g):  # other ranks' share of this batch is missing
                return
            yield batch
            b += 1


def _source(dataset_type: str, path, seq_len: int, vocab_size: int, seed: int, repeat: bool, stream: int,
            document_masking: bool, shuffle: bool = False, mixture: Sequence[tuple[str, float]] = (),
            channels: Mapping[str, Path] | None = None, name: str = "train", tokenizer: ChatTokenizer | None = None,
            truncation_mode: str = "keep_start") -> Source:
    if shuffle and dataset_type not in ("indexed", "chat"):
        raise ValueError(f"shuffle applies to indexed token shards and chat examples, and dataset_type is "
                         f"{dataset_type!r}: pack the data with python -m container.data pack --format indexed, "
                         "or drop shuffle")
    if dataset_type == "synthetic":
        return SyntheticSource(seq_len, vocab_size, seed, stream)
    if dataset_type == "indexed":
        return IndexedSource(_indexed_channels(path, mixture, channels, name), seq_len, vocab_size, seed=seed,
                             shuffle=shuffle, repeat=repeat, document_masking=document_masking)
    if dataset_type == "chat":
        if path is None:
            raise ValueError("dataset_type 'chat' needs a path (the channel directory or files)")
        if tokenizer is None:
            raise ValueError("dataset_type chat needs the model's tokenizer: set hf_pretrained_model_name_or_dir "
                             "or tokenizer")
        return ChatSource(chat_files(path), tokenizer, seq_len, vocab_size, seed=seed, shuffle=shuffle,
                          truncation_mode=truncation_mode, repeat=repeat, document_masking=document_masking,
                          name=name)
    if dataset_type == "jsonl":
        if path is None:
            raise ValueError("dataset_type 'jsonl' needs a path (the channel directory or files)")
        if is_indexed(path) and not _has_records(path):
            raise ValueError(f"{path} holds indexed token shards: set dataset_type: indexed to read them")
        return JsonlSource(data_files(path), seq_len, vocab_size, repeat=repeat, document_masking=document_masking)
    raise ValueError(f"dataset_type must be 'jsonl', 'indexed', 'chat' or 'synthetic', not {dataset_type!r}")


def _has_records(path) -> bool:
    try:
        return bool(data_files(path))
    except FileNotFoundError:
        return False


def _indexed_channels(path, mixture: Sequence[tuple[str, float]], channels: Mapping[str, Path] | None,
                      name: str) -> list[Channel]:
    """The channels an indexed source reads: data_mixture's, by name, else `path`."""
    if not mixture:
        if path is None:
            raise ValueError("dataset_type 'indexed' needs a path (the channel directory)")
        return [Channel(name, Path(path))]
    channels = channels or {}
    missing = [channel for channel, _ in mixture if channel not in channels]
    if missing:
        raise ValueError(f"data_mixture names channel(s) {', '.join(missing)}, which this job does not have "
                         f"(it has {', '.join(sorted(channels)) or 'none'}): add them to the job's inputs")
    return [Channel(channel, channels[channel], weight) for channel, weight in mixture]


def build_dataloader(*, dataset_type: str, path=None, seq_len: int, micro_batch_size: int, dp_rank: int,
                     dp_size: int, grad_accum: int = 1, vocab_size: int, seed: int = 0,
                     start_sample: int = 0, document_masking: bool = True, shuffle: bool = False,
                     mixture: Sequence[tuple[str, float]] = (),
                     channels: Mapping[str, Path] | None = None, tokenizer: ChatTokenizer | None = None,
                     truncation_mode: str = "keep_start") -> TrainLoader:
    """The training loader of one data-parallel rank; `path` is a file, a channel directory or
    a list of them (jsonl, chat), a channel directory (indexed); a mixture of indexed channels names
    them in `channels` (the job's input channels, container.args.channels); chat examples are
    tokenized with `tokenizer` (container.data.chat.load_tokenizer) and cut by `truncation_mode`."""
    return TrainLoader(_source(dataset_type, path, seq_len, vocab_size, seed, repeat=True, stream=0,
                               document_masking=document_masking, shuffle=shuffle, mixture=mixture,
                               channels=channels, tokenizer=tokenizer, truncation_mode=truncation_mode),
                       micro_batch_size=micro_batch_size, dp_rank=dp_rank, dp_size=dp_size,
                       grad_accum=grad_accum, start_sample=start_sample)


def build_validation_loader(*, dataset_type: str, path=None, seq_len: int, micro_batch_size: int,
                            dp_rank: int, dp_size: int, vocab_size: int, seed: int = 0,
                            max_batches: int | None = None, document_masking: bool = True,
                            tokenizer: ChatTokenizer | None = None,
                            truncation_mode: str = "keep_start") -> ValidationLoader:
    """The validation/test loader of one data-parallel rank (synthetic: a stream of samples
    distinct from the training one; indexed and chat: the channel's rows in order)."""
    return ValidationLoader(_source(dataset_type, path, seq_len, vocab_size, seed, repeat=False, stream=1,
                                    document_masking=document_masking, name="validation", tokenizer=tokenizer,
                                    truncation_mode=truncation_mode),
                            micro_batch_size=micro_batch_size, dp_rank=dp_rank, dp_size=dp_size,
                            max_batches=max_batches)
