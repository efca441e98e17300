"""Which entry point is smlaunch's training runtime, and where its packages travel with it: the
client (launcher/config/job_kind.py: which rules apply; launcher/backends/sourcedir.py: what it
ships) and the bootstrap (container/toolkit/bootstrap.py: ranks forked from a preloaded agent)
decide it by the same rule.

The rule: the entry point imports `container.trainer`, as `entrypoints/train.py` does. It is read
from the file's text, never guessed from its name: a user's own `train.py` is a user script.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

# Where smlaunch's own packages sit in a job's code: a name no importable package has, so nothing
# of the user's is shadowed (entrypoints/train.py puts it first on the path, spelled out there: it
# runs before any package can be imported).
PACKAGES_DIR = "_smlaunch"
SCRIPT_READ_LIMIT = 1 << 20  # a script's imports are at its top; a bigger file is not read further
_TRAINER_IMPORT = re.compile(r"^\s*(from\s+container\.trainer\s+import|import\s+container\.trainer\b)", re.MULTILINE)


def imports_trainer(text: str) -> bool:
    """The script's text imports smlaunch's runtime (container.trainer)."""
    return bool(_TRAINER_IMPORT.search(text))


def read_start(entry: Path) -> str:
    """The start of a regular file (OSError otherwise): a FIFO or a device named as the entry point
    must not block or stream without end."""
    fd = os.open(entry, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{entry} is not a regular file")
        return os.read(fd, SCRIPT_READ_LIMIT).decode("utf-8", "replace")
    finally:
        os.close(fd)


def is_runtime(entry: Path) -> bool:
    """`entry` is smlaunch's runtime; False where it cannot be read."""
    try:
        return imports_trainer(read_start(entry))
    except OSError:
        return False
