"""Where a channel's training records are, what a JSON Lines record's fields do, and how long its
blocks are (torch-free: the client checks local channels against the run with it, the container
reads the same files by the same rules).

What kind of file a path is (`not_data`, `file_kind`), for the inputs that must be regular files or
directories: a job file, a channel's content. A device, FIFO or socket never ends or never starts
(`/dev/zero` copied into a channel fills the disk; a FIFO blocks or reads as empty), so it is refused,
naming the path, rather than read.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

DATA_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
# The channels smlaunch's train.py reads, each under the names it accepts, first found wins.
TRAIN_CHANNELS = ("train", "training")
VALIDATION_CHANNELS = ("validation", "test")

# What a JSON Lines record's fields do (docs/data.md). Used: read as container/data/loader.py
# describes. Refused: they change how a record trains and are not read (the message says what to
# give instead). Any other field is metadata (text, id, source, ...): ignored, and listed once in
# the job log.
USED_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids")
_AS_POSITION_IDS = ("give position_ids restarting at 0 at each document (Hugging Face's "
                    "DataCollatorWithFlattening convention) instead")
_CHAT = ("chat and instruction records are tokenized with the model's chat template, which JSON Lines token "
         "channels (dataset_type jsonl) do not do: set dataset_type: chat (docs/data.md), or give input_ids and "
         "labels (-100 where no loss applies)")
REFUSED_FIELDS = {
    **{name: _AS_POSITION_IDS for name in ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "seq_lens",
                                           "seq_idx", "document_ids", "segment_ids", "sequence_ids")},
    "token_type_ids": "Llama models have no token types: drop the field",
    **{name: "per-token loss weights are not read: give labels with -100 where no loss applies"
       for name in ("loss_weight", "loss_weights", "loss_mask", "weight", "weights", "sample_weight",
                    "completion_mask", "assistant_masks")},
    **{name: _CHAT for name in ("messages", "prompt", "completion", "conversations")},
}


def data_files(path: str | Path | Sequence[str | Path], suffixes: tuple[str, ...] = DATA_SUFFIXES) -> list[Path]:
    """The data files under `path` (a file, a channel directory, or a list of them), in order:
    each directory contributes its files of `suffixes` (JSON Lines by default; any depth) sorted
    by relative name."""
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(suffixes))
            if not found:
                raise FileNotFoundError(f"{p}: no data files ({', '.join(suffixes)}) in the directory")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return files


def open_text(path: Path):
    if path.name.endswith(".gz"):
        import gzip  # only for compressed files: `smlaunch validate` imports this module

        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def json_lines(path: Path, not_json: Callable[[str, str], Exception]) -> Iterator[tuple[str, object]]:
    """(`file:line`, record) of each non-blank line of a JSON Lines file; a line that is not JSON
    raises not_json(where, what the parser says)."""
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise not_json(where, e.msg) from None
            yield where, record


def refused_field(record: dict, where: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a record's first refused field (REFUSED_FIELDS), naming the
    record; None when it has none."""
    name = next((name for name in record if name in REFUSED_FIELDS), None)
    if name is None:
        return None
    return f"{where}: field {name!r} changes how the record trains and is not read", REFUSED_FIELDS[name]


def first_record(path: str | Path) -> tuple[str, object] | None:
    """(file:line, record) of the first record under `path`; None when it has no readable record
    (the container reports what is wrong with it, by line)."""
    try:
        first = data_files(path)[0]
        with open_text(first) as f:
            found = next(((n, line) for n, line in enumerate(f, 1) if line.strip()), None)
        return (f"{first}:{found[0]}", json.loads(found[1])) if found else None
    except (OSError, EOFError, ValueError, IndexError):
        return None


def first_block_length(path: str | Path) -> tuple[str, int] | None:
    """(file:line, number of input_ids) of the first record under `path`; None when it has no
    readable record or that has no list of input_ids."""
    found = first_record(path)
    ids = found[1].get("input_ids") if found and isinstance(found[1], dict) else None
    return (found[0], len(ids)) if isinstance(ids, list) else None


# --- what may be a channel's content --------------------------------------------------------------
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """'' for a regular file, else what a file of this `st_mode` is ('a FIFO', ...)."""
    if stat.S_ISREG(mode):
        return ""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_data(path: Path) -> str | None:
    """Why `path` cannot be a channel's content (a path that is, or holds, something other than
    regular files and directories, links followed), or None: 'PATH is a character device'."""
    problem = _not_data_entry(path)
    if problem or not path.is_dir():
        return problem
    for root, _dirs, files in os.walk(path):  # as the channel is copied: links to directories stay unfollowed
        for name in files:
            if problem := _not_data_entry(Path(root) / name):
                return problem
    return None


def _not_data_entry(path: Path) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror}{', a broken link' if os.path.islink(path) else ''})"
    if stat.S_ISDIR(mode):
        return None
    kind = file_kind(mode)
    return f"{path} is {kind}{' (through a link)' if os.path.islink(path) else ''}" if kind else None
