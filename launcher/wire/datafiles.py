"""Where a channel's training records are, and how long its blocks are (torch-free: the client
checks local channels against max_context_width with it, the container reads the same files)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

DATA_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
# The channels smlaunch's train.py reads, each under the names it accepts, first found wins.
TRAIN_CHANNELS = ("train", "training")
VALIDATION_CHANNELS = ("validation", "test")


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


def first_block_length(path: str | Path) -> tuple[Path, int] | None:
    """(file, number of input_ids) of the first record under `path`; None when it has no
    readable record (the container reports what is wrong with it, by line)."""
    try:
        first = data_files(path)[0]
        with open_text(first) as f:
            line = next((line for line in f if line.strip()), None)
        ids = json.loads(line)["input_ids"] if line else None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return (first, len(ids)) if isinstance(ids, list) else None
