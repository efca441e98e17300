"""The bootstrap's own lines on the console: `[smlaunch] ...` on stderr, secrets masked."""

from __future__ import annotations

import sys

from launcher.wire import masking


def log(message: str) -> None:
    print(f"[smlaunch] {masking.installed()(message)}", file=sys.stderr, flush=True)
