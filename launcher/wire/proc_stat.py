"""A process's `/proc/<pid>/stat`, as the bootstrap (container/toolkit/frozen_ranks.py) and the local
supervisor (launcher/local/leftovers.py, identity.py) read it: here once, beside the other things
both sides of a job share, because the name field makes it easy to misread."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def stat_fields(pid: int) -> list[str] | None:
    """The fields after the process's name, its state first (field 3 of proc(5)); None once the
    process is gone or without /proc. The name sits in parentheses and may hold spaces and
    parentheses itself, so the fields start after the last ')'."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def parent_and_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, None once it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[1]), fields[0])
