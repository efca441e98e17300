"""Why a checkpoint file could not be written, in words a user can act on, on every rank alike.

A full disk reaches a save in several disguises: torch's zip writer turns the OSError of a failed
write into `RuntimeError: ... unexpected pos 704 vs 598` (the OSError survives only as its
`__context__`), a path given to torch.save fails in C++ with no errno at all, and Python's own
writes raise `[Errno 28] No space left on device` without a file name. DCP then pickles each
rank's exception to the others, which drops `__context__`. So every write of a save runs under
`writing(path)`, which raises the underlying OSError again with the file's name, before anything
is pickled; `describe` turns it into the words of the error the ranks agree on
(container.checkpoint.collectives.together).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import FileSystem


def os_error(exc: BaseException) -> OSError | None:
    """The first OSError in `exc`'s chain (itself, its cause or the exception it interrupted)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Raise a write failure under it as the OSError beneath it, naming `path`."""
    try:
        yield
    except Exception as exc:
        error = os_error(exc)
        if error is None or error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from exc


def save(value, path: Path) -> None:
    """torch.save through a Python file, so that a failed write keeps its OSError (torch's C++
    writer of a path reports only that it failed), under writing(path)."""
    with writing(path), open(path, "wb") as f:
        torch.save(value, f)


class NamingFileSystem(FileSystem):
    """DCP's local file system, whose every file is written under writing(path)."""

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with writing(path), super().create_stream(path, mode) as stream:
            yield stream


def describe(exc: BaseException) -> str:
    """`No space left on device (ENOSPC) writing <file>` for a failed write, else the type and text."""
    error = os_error(exc)
    if error is None:
        return f"{type(exc).__name__}: {exc}"
    code = errno.errorcode.get(error.errno, str(error.errno))
    where = f" writing {error.filename}" if error.filename else ""
    return f"{error.strerror} ({code}){where}"
