"""`python -m container.data inspect` of a chat channel (`dataset_type: chat`: JSON Lines or Parquet
records of messages, or prompt and completion): what the job would train, counted by the job's own
functions. Each record is tokenized with the tokenizer given (container.data.chat's ChatTokenizer:
the model's chat template, the labels of the answers), and with a row width, cut by the truncation
mode and packed into rows as the job packs them (container.data.chat_source's keep and
best_fit_decreasing), so the counts are those of the job log's line. A document is one example,
numbered by record in the job's reading order; every record before the last one asked is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from container.data.chat import ChatTokenizer, Example
from container.data.chat_source import Counts, best_fit_decreasing, keep
from container.data.encoders import load_tokenizer
from launcher.wire.chat_records import chat_files, read_records
from launcher.wire.datafiles import first_record
from launcher.wire.token_shards import tokenizer_identity

# A record with one of these fields (and no input_ids) is a chat record; `conversations` too, which
# the chat reader refuses with its fix.
CHAT_FIELDS = ("messages", "prompt", "completion", "conversations")


def is_chat(path: Path) -> bool:
    """Whether `path` holds chat records: Parquet files (which a job reads only as chat records), or a
    first JSON Lines record with a chat field and no input_ids."""
    try:
        files = chat_files(path)
    except FileNotFoundError:
        return False
    if any(f.name.endswith(".parquet") for f in files):
        return True
    found = first_record(path)
    record = found[1] if found else None
    return isinstance(record, dict) and "input_ids" not in record and any(f in record for f in CHAT_FIELDS)


def open_tokenizer(name: str) -> ChatTokenizer:
    """The tokenizer `--tokenizer` names (a directory or Hub id), as the job tokenizes with it; a
    failure to load is container.data.encoders' PackError naming the flag."""
    return ChatTokenizer(load_tokenizer(name), name)


def _kept(example: Example, width: int | None, mode: str, counts: Counts) -> Example | None:
    # without a width every example is kept whole: a row as long as itself
    return keep(example, width or len(example.input_ids), mode, counts)


def _file_row(file: Path, path: Path, tokenizer: ChatTokenizer, counts: Counts, kept: list[int], max_id: int | None,
              add) -> dict:
    name = Path(tokenizer.name)
    row = {"file": str(file.relative_to(path) if path.is_dir() else file.name),
           "format": "chat records (Parquet)" if file.name.endswith(".parquet") else "chat records (JSON Lines)",
           "dtype": None, "records": counts.examples, "documents": len(kept), "tokens": counts.tokens,
           "trained": counts.trained, "truncated": counts.truncated,
           "dropped": counts.dropped_long + counts.dropped_untrained,
           "tokenizer": tokenizer_identity(tokenizer.name, name / "tokenizer.json" if name.is_dir() else None),
           "vocab_size": len(tokenizer.tokenizer), "max_token_id": max_id, "lengths": {}}
    for length in kept:
        add(row["lengths"], length)
    return row


def summary(path: Path, tokenizer: ChatTokenizer, width: int | None, mode: str, add) -> dict:
    """The channel's report: each file's examples, the tokens kept and trained, what truncation did,
    the kept examples' lengths counted by `add(lengths, length)` (inspect_corpus's buckets); with a
    width, the rows best-fit packing makes of them all and their padding."""
    files, every = [], []
    for file in chat_files(path):
        counts, kept, max_id = Counts(), [], None
        for where, record in read_records([file]):
            cut = _kept(tokenizer.example(record, where), width, mode, counts)
            if cut is not None:
                kept.append(len(cut.input_ids))
                max_id = max(max_id or 0, max(cut.input_ids))
        files.append(_file_row(file, path, tokenizer, counts, kept, max_id, add))
        every += kept
    report = {"path": str(path), "files": files}
    if width:
        rows = len(best_fit_decreasing(every, width))
        report.update(max_context_width=width, truncation_mode=mode, rows=rows, padding=rows * width - sum(every))
    return report


def documents(path: Path, tokenizer: ChatTokenizer, width: int | None, mode: str, begin: int,
              end: int | None) -> Iterator[tuple[int, dict]]:
    """(number, fields) of examples [begin, end): the record's place, and the input_ids and labels
    (-100 where not trained, before the shift) the job keeps of it, or why it drops it."""
    for number, (where, record) in enumerate(read_records(chat_files(path))):
        if end is not None and number >= end:
            return
        if number < begin:
            continue
        example = tokenizer.example(record, where)
        cut = _kept(example, width, mode, Counts())
        if cut is None:
            why = ("truncation_mode drop" if mode == "drop" else
                   f"nothing left to train once cut by truncation_mode {mode}")
            yield number, {"where": where, "dropped": f"{len(example.input_ids):,} tokens, longer than "
                                                      f"max_context_width={width}: {why}"}
        else:
            yield number, {"where": where, "input_ids": cut.input_ids, "labels": cut.labels}
