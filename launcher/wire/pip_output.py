"""Lines of pip's output that say nothing about the install: one rule for every pip smlaunch runs
and shows (the Makefile's, through scripts/uv-pip.py --pip; a job's environment, launcher.local.jobenv;
the bootstrap's install of requirements.txt, container.toolkit.code).

A pip configuration that names local indexes or find-links directories missing on this machine
(a shared pip.conf, a CI image's), or a local index without the package, makes pip print, for
every package it looks up, "WARNING: Location '...' is ignored: it is neither a file nor a
directory." It changes nothing: pip skips such a location either way. Imports nothing.
"""

from __future__ import annotations

import re

IGNORED_LOCATION = re.compile(r"^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.\s*$")


def is_noise(line: str) -> bool:
    """Whether a line of pip's output (with or without its newline) is one of the above."""
    return bool(IGNORED_LOCATION.match(line))


def without_noise(text: str) -> str:
    """`text` (pip's output) without those lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not is_noise(line))
