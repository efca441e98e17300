"""What a checkpoint must hold, and whether it still does: per-rank manifest parts and a marker.

Every rank lists the files it wrote (name, size, sha256) in `manifest-<rank>.json`; once every
rank has, rank 0 writes `.complete`, naming the step and how many parts there must be. A rank
hashes only its own files, because on SageMaker each host writes to its own disk (the hosts'
files meet in the S3 checkpoint prefix) and sees only its own shards during a save. At resume
every file is on every host, so any rank can verify any file: `inspect` (cheap: marker, parts,
presence and sizes) runs on rank 0, the hashing is spread over the ranks with `share`.

Each check answers with a reason (None when the checkpoint passes) that names the file and what
is wrong with it, so the log says why a checkpoint was skipped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from container.checkpoint.write_errors import writing
from launcher.wire.checkpoints import MARKER

FORMAT = 2  # 1: the marker alone (before manifests), never usable for resume
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Entry:
    """One file of a checkpoint as its writer recorded it."""

    name: str
    size: int
    sha256: str
    part: str  # the manifest part that lists it, for the reason


def part_name(rank: int) -> str:
    return f"manifest-{rank}.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_part(directory: Path, rank: int, names: list[str]) -> None:
    """This rank's files, hashed after they were written (the manifest sees what the disk holds)."""
    files = {name: {"size": (directory / name).stat().st_size, "sha256": sha256_of(directory / name)}
             for name in sorted(set(names))}
    with writing(directory / part_name(rank)):
        (directory / part_name(rank)).write_text(json.dumps({"rank": rank, "files": files}, indent=1) + "\n")


def write_marker(directory: Path, step: int, parts: int) -> None:
    """Rank 0, after every rank's part is written: the checkpoint is complete."""
    with writing(directory / MARKER):
        (directory / MARKER).write_text(json.dumps({"format": FORMAT, "step": step, "parts": parts}) + "\n")


def has_marker(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def inspect(directory: Path, step: int, required: tuple[str, ...]) -> tuple[list[Entry], str | None]:
    """(the files to hash, None), or ([], the reason the checkpoint is not usable). Checks the
    marker, every manifest part, that `required` files are listed, and every listed file's size."""
    parts, reason = _read_marker(directory, step)
    if reason:
        return [], reason
    entries: list[Entry] = []
    for rank in range(parts):
        listed, reason = _read_part(directory, rank, parts)
        if reason:
            return [], reason
        entries += listed
    names = {e.name for e in entries}
    for name in required:
        if name not in names:
            return [], f"{name} is not listed in any manifest part"
    for entry in entries:
        path = directory / entry.name
        if not path.is_file():
            return [], f"{entry.name} is missing ({entry.part} lists it)"
        size = path.stat().st_size
        if size != entry.size:
            return [], f"{entry.name} is {size} bytes, {entry.part} says {entry.size} (truncated or overwritten)"
    return entries, None


def share(entries: list[Entry], rank: int, world: int) -> list[Entry]:
    """This rank's part of the hashing: largest files first, each to the least loaded rank, so
    that no rank hashes much more than 1/world of the bytes. The same on every rank."""
    loads = [0] * world
    mine: list[Entry] = []
    for entry in sorted(entries, key=lambda e: (-e.size, e.name)):
        target = loads.index(min(loads))
        loads[target] += entry.size
        if target == rank:
            mine.append(entry)
    return mine


def first_mismatch(directory: Path, entries: list[Entry]) -> str | None:
    """The first of `entries` whose content no longer has its recorded hash."""
    for entry in entries:
        try:
            digest = sha256_of(directory / entry.name)
        except OSError as exc:  # a reason, not an exception: the other ranks must hear of it
            return f"{entry.name} cannot be read ({exc})"
        if digest != entry.sha256:
            return f"{entry.name} does not match its sha256 in {entry.part} (changed after the save)"
    return None


def _read_marker(directory: Path, step: int) -> tuple[int, str | None]:
    path = directory / MARKER
    if not path.is_file():
        return 0, f"no {MARKER} marker: the save did not finish (stopped mid-save, or an incomplete sync)"
    try:
        marker = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return 0, f"{MARKER} is not valid JSON"
    if not isinstance(marker, dict) or "parts" not in marker:
        return 0, (f"no manifest ({MARKER} names no manifest parts): an older checkpoint format without "
                   "content hashes, or a save cut short")
    parts, marked = marker.get("parts"), marker.get("step")
    if type(parts) is not int or parts < 1 or type(marked) is not int:
        return 0, f"{MARKER} is not a valid marker: {marker!r}"
    if marked != step:
        return 0, f"{MARKER} names step {marked}, not {step}: the directory was copied or renamed"
    return parts, None


def _read_part(directory: Path, rank: int, parts: int) -> tuple[list[Entry], str | None]:
    name = part_name(rank)
    path = directory / name
    if not path.is_file():
        return [], f"{name} is missing (the marker names {parts} parts)"
    try:
        files = json.loads(path.read_text())["files"]
        entries = [Entry(file, int(info["size"]), str(info["sha256"]), name) for file, info in files.items()]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return [], f"{name} is not a valid manifest part ({type(exc).__name__}: {exc})"
    for entry in entries:
        if Path(entry.name).name != entry.name or entry.name in (".", ".."):
            return [], f"{name} lists {entry.name!r}, which is not a file of the checkpoint directory"
    return entries, None
