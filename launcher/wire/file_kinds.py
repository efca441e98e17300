"""What kind of file a path is, for the inputs that must be regular files or directories: a job
file, a channel's content. A device, FIFO or socket never ends or never starts (`/dev/zero`
copied into a channel fills the disk; a FIFO blocks or reads as empty), so it is refused, naming
the path, rather than read. Pure stdlib."""

from __future__ import annotations

import os
import stat
from pathlib import Path

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
