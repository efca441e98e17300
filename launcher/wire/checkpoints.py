"""Where a job's checkpoints are and which is the newest complete one, read without torch.

A checkpoint is a `step-<N>/` directory; it is complete once rank 0 has written its `.complete`
marker, after every rank's files and manifest part (container/checkpoint/checkpointer.py and
container/checkpoint/manifest.py, which take these names from here). `smlaunch status` names the
newest complete one: in a local or Slurm job's checkpoint directory, or under a SageMaker job's
checkpoint_s3_uri.

And what a checkpoint records of the data its position indexes (`data-streams.json`
in a step-<N> directory, written by rank 0 beside trainer.pt, read at resume by the runtime and by
`smlaunch validate` for a local checkpoint directory; the section at the end says what it holds).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.wire.chat_records import chat_files
from launcher.wire.datafiles import data_files
from launcher.wire.megatron_index import FORMAT, MegatronHeader, fingerprint
from launcher.wire.token_shards import read_header, shard_indexes

# Imports inside functions: s3io (and botocore) only where a checkpoint is looked for under an s3://
# prefix, which the client does; every rank's checkpointer imports this module and never does.

DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"  # SageMaker's checkpoint_local_path
MARKER = ".complete"
# what `status` says of a checkpoint found by its marker (`Verified: false`)
UNVERIFIED = "; complete marker, not verified (resume verifies it and falls back to an older one)"
STEP_DIR = re.compile(r"step-(\d+)")
STEP_TMP_DIR = re.compile(r"step-(\d+)\.tmp")  # a save in progress, renamed to step-<N> once every rank wrote


@dataclass(frozen=True)
class Checkpoint:
    step: int
    where: str  # the step-<N> directory: a local path or an s3:// URI
    copy: str | None = None  # where the job copies it when it ends (a local job's checkpoint_s3_uri)

    def to_dict(self) -> dict:
        # Found by its marker alone: only resume verifies its manifest (sizes, sha256, the parts
        # against the DCP metadata), and falls back to an older one when it fails.
        out = {"Step": self.step, "Location": self.where, "Verified": False}
        if self.copy:
            out["CopiedTo"] = self.copy
        return out

    def text(self) -> str:
        return f"step {self.step}, {self.where}" + (f" (copied to {self.copy})" if self.copy else "")


def step_dirs(directory: Path) -> list[int]:
    """The steps of the step-<N> directories in `directory`, oldest first (complete or not)."""
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := STEP_DIR.fullmatch(p.name)))


def complete_steps(directory: Path) -> list[int]:
    """The steps whose directory has its marker, oldest first."""
    return [step for step in step_dirs(directory) if (directory / f"step-{step}" / MARKER).is_file()]


def latest_local(directory: Path, s3_uri: str | None = None) -> Checkpoint | None:
    """The newest step-<N> of `directory` with its marker; `s3_uri`: where the job copies them."""
    complete = complete_steps(directory)
    if not complete:
        return None
    step = complete[-1]
    copy = f"{s3_uri.rstrip('/')}/step-{step}" if s3_uri else None
    return Checkpoint(step, str(directory / f"step-{step}"), copy)


def latest_in_s3(s3_client, uri: str) -> Checkpoint | None:
    """The newest step-<N>/ under the s3:// prefix `uri` whose marker is there (SageMaker syncs
    each host's /opt/ml/checkpoints to that prefix)."""
    from botocore.exceptions import ClientError

    from launcher.wire import s3io

    bucket, prefix = s3io.split(uri)
    prefix = prefix.strip("/")
    base = f"{prefix}/" if prefix else ""
    steps = []
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            if m := STEP_DIR.fullmatch(common["Prefix"][len(base):].rstrip("/")):
                steps.append(int(m.group(1)))
    for step in sorted(steps, reverse=True):
        try:
            s3_client.head_object(Bucket=bucket, Key=f"{base}step-{step}/{MARKER}")
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                continue  # a save that did not finish, or a sync still under way
            raise
        return Checkpoint(step, f"s3://{bucket}/{base}step-{step}")
    return None


# --- what a checkpoint records of the data its position indexes: data-streams.json ----------------
# A data position (the global index of the next sample) means something only for the stream it was
# counted in. The stream's settings (dataset_type, seed, shuffle, mixture) are the checkpoint's
# `keeps` (launcher.wire.training.resume); this is the data itself, per channel the loader reads:
#
#     {"dataset_type": "indexed", "shuffled": true,
#      "channels": {"train": {"tokenizer": {"name", "vocabulary_sha256"}, "vocab_size": 32000,
#                             "shards": [{"name": "web-00000.idx", "bytes": 2147483648,
#                                         "documents": 812345, "tokens": 1073741824}, ...]}}}
#
# An indexed channel: its shards in reading order (name relative to the channel, the .bin's size,
# the header's documents and tokens) and the tokenizer the headers record; a Megatron-Core corpus's pairs
# with a fingerprint of their content (launcher.wire.megatron_index.fingerprint), its "format", and the
# tokenizer the job gives (null where the client cannot see it: then not compared). A JSON Lines or chat
# channel: {"files": [{"name", "bytes"}, ...]}, in reading order. launcher.wire.training.resume says
# what a resume makes of a difference.
DATA_STREAMS_FILE = "data-streams.json"
_INDEXED, _CHAT = "indexed", "chat"


def _name(file: Path, channel: Path) -> str:
    """A file's name as the record keeps it: relative to the channel directory, which is mounted at
    another path in every job (/opt/ml/input/data/<channel>, a local directory)."""
    return file.relative_to(channel).as_posix() if channel.is_dir() else file.name


def channel_record(dataset_type: str, path: str | Path, tokenizer: dict | None = None) -> dict:
    """What one channel (a directory, or a file) holds, as `data_streams` keeps it; a channel without
    data raises FileNotFoundError, a damaged shard ShardError. `tokenizer`: the one the job gives, which
    a Megatron corpus is taken to be of (None: not known here, not compared)."""
    path = Path(path)
    if dataset_type == _INDEXED:
        headers = [read_header(idx) for idx in shard_indexes(path)]
        if not headers:
            raise FileNotFoundError(f"{path}: no indexed token shards")
        if isinstance(headers[0], MegatronHeader):
            return _megatron_record(headers, path, tokenizer)
        return {"tokenizer": headers[0].tokenizer, "vocab_size": headers[0].vocab_size,
                "shards": [{"name": _name(h.idx, path), "bytes": os.path.getsize(h.bin), "documents": h.documents,
                            "tokens": h.tokens} for h in headers]}
    files = chat_files(path) if dataset_type == _CHAT else data_files(path)
    return {"files": [{"name": _name(f, path), "bytes": f.stat().st_size} for f in files]}


def _megatron_record(headers: list, path: Path, tokenizer: dict | None) -> dict:
    """A Megatron corpus records no tokenizer: the job's is recorded (its vocabulary size is the
    model's, which the checkpoint's identity keeps); a rebuilt corpus may keep its sizes: each
    pair's fingerprint tells it apart."""
    return {"format": FORMAT, "tokenizer": tokenizer, "vocab_size": None,
            "shards": [{"name": _name(h.idx, path), "bytes": os.path.getsize(h.bin), "documents": h.documents,
                        "tokens": h.tokens, "fingerprint": fingerprint(h)} for h in headers]}


def data_streams(dataset_type: str, shuffled: bool, channels: Mapping[str, str | Path],
                 tokenizer: dict | None = None) -> dict:
    """The record of the training stream read from `channels` (name -> path, in the loader's order);
    `tokenizer`: channel_record's."""
    return {"dataset_type": dataset_type, "shuffled": shuffled,
            "channels": {name: channel_record(dataset_type, path, tokenizer) for name, path in channels.items()}}


def write_data_streams(step_dir: Path, streams: dict) -> None:
    (Path(step_dir) / DATA_STREAMS_FILE).write_text(json.dumps(streams, indent=1) + "\n")


def read_data_streams(step_dir: Path) -> dict | None:
    """The record of a checkpoint; None for one saved before smlaunch wrote it."""
    try:
        return json.loads((Path(step_dir) / DATA_STREAMS_FILE).read_text())
    except FileNotFoundError:
        return None
