"""`python -m container.data inspect` of a JSON Lines token channel (`dataset_type: jsonl`: records
of input_ids, the blocks `pack --format jsonl` writes): the summary container.data.inspect_corpus
prints of indexed shards, from the records. A document is what the job trains as one: a run of a
record's tokens from a position_ids 0 to the next (a record without position_ids is one sequence).
Every record is parsed (JSON Lines has no index): a 1 GB channel takes a few seconds a core.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from launcher.wire.datafiles import data_files, json_lines

FORMAT = "JSON Lines token records"


class RecordError(ValueError):
    """A record inspect cannot read as tokens: the file and line, what is wrong."""


def _records(path: Path) -> Iterator[tuple[Path, str, dict]]:
    """(file, file:line, record) of every record under `path`, in the job's reading order."""
    for file in data_files(path):
        for where, record in json_lines(file, lambda where, what: RecordError(f"{where}: not JSON ({what})")):
            if not isinstance(record, dict) or not isinstance(record.get("input_ids"), list):
                raise RecordError(f"{where}: not a token record (no list 'input_ids'); inspect reads token "
                                  "channels (chat records are tokenized by the job with the model's tokenizer)")
            yield file, where, record


def _segments(record: dict, where: str) -> list[list[int]]:
    """A record's documents: its tokens cut where position_ids restart at 0."""
    ids, positions = record["input_ids"], record.get("position_ids")
    if positions is None:
        return [ids]
    if not isinstance(positions, list) or len(positions) != len(ids):
        raise RecordError(f"{where}: position_ids is not a list of one position per token")
    starts = [i for i, p in enumerate(positions) if p == 0 or i == 0] + [len(ids)]
    return [ids[a:b] for a, b in zip(starts, starts[1:])]


def documents(path: Path, begin: int, end: int | None) -> Iterator[tuple[int, list[int]]]:
    """(number, token ids) of the channel's documents [begin, end)."""
    number = 0
    for _, where, record in _records(path):
        for segment in _segments(record, where):
            if end is not None and number >= end:
                return
            if number >= begin:
                yield number, segment
            number += 1


def summary(path: Path, add) -> dict:
    """The channel's report, each file's documents' lengths counted by `add(lengths, length)`
    (container.data.inspect_corpus's buckets)."""
    files: dict[Path, dict] = {}
    for file, where, record in _records(path):
        row = files.setdefault(file, {"file": str(file.relative_to(path) if path.is_dir() else file.name),
                                      "format": FORMAT, "dtype": None, "records": 0, "documents": 0, "tokens": 0,
                                      "tokenizer": None, "vocab_size": None, "max_token_id": None, "lengths": {}})
        row["records"] += 1
        for segment in _segments(record, where):
            row["documents"] += 1
            row["tokens"] += len(segment)
            if segment:
                row["max_token_id"] = max(row["max_token_id"] or 0, max(segment))
            add(row["lengths"], len(segment))
    return {"path": str(path), "files": list(files.values())}
