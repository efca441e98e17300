"""Paths a job names on this machine: checked as text before any file system call sees them; and
where smlaunch keeps its own state here (SMLAUNCH_HOME), which no job's code ships.

A `~user` that names no user makes pathlib raise RuntimeError, and a name longer than the file
system allows makes every stat raise ENAMETOOLONG; both are the job's mistakes, so they are
validation errors naming the field (an s3:// URI is not a local path and passes as it is).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

HOME_ENV = "SMLAUNCH_HOME"  # default ~/.smlaunch: local jobs (launcher.local.store), their environments
NAME_MAX = 255  # bytes in one path component (Linux, macOS)
PATH_MAX = 4095  # bytes in a whole path, without the terminating NUL (Linux)


def smlaunch_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".smlaunch").expanduser()


def check_path_text(value: str) -> str:
    if value.startswith("s3://"):
        return value
    path = value.removeprefix("file://")
    if "\0" in path:
        raise ValueError("holds a NUL character; write the path without it")
    if path.startswith("~") and os.path.expanduser(path.split("/", 1)[0]).startswith("~"):
        user = path.split("/", 1)[0]
        raise ValueError(f"{user} names no user with a home directory here; write the path out in full")
    encoded = os.fsencode(path)
    if len(encoded) > PATH_MAX:
        raise ValueError(f"is {len(encoded)} bytes long, more than the {PATH_MAX} a path may have; use a shorter path")
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise ValueError(f"has a name of {len(longest)} bytes ({os.fsdecode(longest[:40])}...), more than the "
                         f"{NAME_MAX} a file system allows; use shorter names")
    return value


LocalPathText = Annotated[str, AfterValidator(check_path_text)]
