"""What a checkpoint records of the data its position indexes: `data-streams.json` in a step-<N>
directory, written by rank 0 beside trainer.pt (container/checkpoint/checkpointer.py), read at resume
by the runtime and by `smlaunch validate` for a local checkpoint directory (stdlib only).

A data position (the global index of the next sample) means something only for the stream it was
counted in. The stream's settings (dataset_type, seed, shuffle, mixture) are the checkpoint's
`keeps` (launcher.wire.training.resume); this is the data itself, per channel the loader reads:

    {"dataset_type": "indexed", "shuffled": true,
     "channels": {"train": {"tokenizer": {"name", "vocabulary_sha256"}, "vocab_size": 32000,
                            "shards": [{"name": "web-00000.idx", "bytes": 2147483648,
                                        "documents": 812345, "tokens": 1073741824}, ...]}}}

An indexed channel: its shards in reading order (name relative to the channel, the .bin's size,
the header's documents and tokens) and the tokenizer the headers record. A JSON Lines or chat
channel: {"files": [{"name", "bytes"}, ...]}, in reading order. launcher.wire.training.resume_data says
what a resume makes of a difference.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from launcher.wire.chat_records import chat_files
from launcher.wire.datafiles import data_files
from launcher.wire.token_shards import read_header, shard_indexes

FILE = "data-streams.json"
INDEXED, CHAT = "indexed", "chat"


def _name(file: Path, channel: Path) -> str:
    """A file's name as the record keeps it: relative to the channel directory, which is mounted at
    another path in every job (/opt/ml/input/data/<channel>, a local directory)."""
    return file.relative_to(channel).as_posix() if channel.is_dir() else file.name


def channel_record(dataset_type: str, path: str | Path) -> dict:
    """What one channel (a directory, or a file) holds, as `record` keeps it; a channel without data
    raises FileNotFoundError, a damaged shard ShardError."""
    path = Path(path)
    if dataset_type == INDEXED:
        headers = [read_header(idx) for idx in shard_indexes(path)]
        if not headers:
            raise FileNotFoundError(f"{path}: no indexed token shards")
        return {"tokenizer": headers[0].tokenizer, "vocab_size": headers[0].vocab_size,
                "shards": [{"name": _name(h.idx, path), "bytes": os.path.getsize(h.bin), "documents": h.documents,
                            "tokens": h.tokens} for h in headers]}
    files = chat_files(path) if dataset_type == CHAT else data_files(path)
    return {"files": [{"name": _name(f, path), "bytes": f.stat().st_size} for f in files]}


def record(dataset_type: str, shuffled: bool, channels: Mapping[str, str | Path]) -> dict:
    """The record of the training stream read from `channels` (name -> path, in the loader's order)."""
    return {"dataset_type": dataset_type, "shuffled": shuffled,
            "channels": {name: channel_record(dataset_type, path) for name, path in channels.items()}}


def write(step_dir: Path, streams: dict) -> None:
    (Path(step_dir) / FILE).write_text(json.dumps(streams, indent=1) + "\n")


def read(step_dir: Path) -> dict | None:
    """The record of a checkpoint; None for one saved before smlaunch wrote it."""
    try:
        return json.loads((Path(step_dir) / FILE).read_text())
    except FileNotFoundError:
        return None
