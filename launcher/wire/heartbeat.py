"""A heartbeat a script of the user's own may send (docs/own-scripts.md, "A script that hangs").

With `hang_timeout`, the bootstrap finds a script hung when its ranks use no CPU and write nothing
(container.toolkit.script_watch). A script that wants finer control calls `beat()` where it makes
progress (each step, say): from its first beat on, the script is hung when no rank has beaten for
hang_timeout, whatever its CPU and output, so a rank that spins while it waits (a busy-polling
transport) or a thread that keeps working (a tracker's uploader) no longer hides a hang. `beat()`
touches one file per rank in the attempt's directory the bootstrap names in SMLAUNCH_HEARTBEAT_DIR;
elsewhere (the variable unset: no hang_timeout, or not under smlaunch) it does nothing. Stdlib only:
`from launcher.wire.heartbeat import beat` imports no torch and nothing else of smlaunch's.
"""

from __future__ import annotations

import os
from pathlib import Path

HEARTBEAT_DIR_ENV = "SMLAUNCH_HEARTBEAT_DIR"


def beat() -> None:
    """This rank makes progress (its file's time is the beat's)."""
    directory = os.environ.get(HEARTBEAT_DIR_ENV)
    if directory:
        (Path(directory) / f"rank-{os.environ.get('RANK', '0')}").touch()


def newest_beat(directory: Path) -> int | None:
    """The time (ns) of the newest beat of any rank in `directory`; None before the first."""
    times = []
    for path in Path(directory).glob("rank-*"):
        try:
            times.append(path.stat().st_mtime_ns)
        except OSError:  # gone with the attempt's scratch
            continue
    return max(times, default=None)
