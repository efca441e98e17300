"""What `submit` and `logs --follow` show while a job runs.

Written to a file or a pipe, the output is the log's lines, whole, and nothing else. On a terminal
a training record's line and the launch command print short (launcher.backends.console_lines), and
a rich progress bar stays below the lines, fed by the `[metrics]` lines among them
(launcher.wire.metric_lines: step of max_steps, loss, tokens/s, ETA), so every backend's bar comes from
what its logs already say.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Self

from launcher.backends.console_lines import shown
from launcher.local.supervise import console_printer
from launcher.wire.metric_lines import Progress, from_line

_ACTIVE: LiveProgress | None = None
STARTING, TRAINING = "starting", "training"  # the bar's words until a backend says more (SageMaker does)


def active() -> LiveProgress | None:
    """The bar on screen now, if any: SageMaker's wait shows its status in it, since a terminal
    holds one live display at a time."""
    return _ACTIVE if _ACTIVE is not None and _ACTIVE.bar is not None else None


class LiveProgress:
    """`line` and `host_line` are the printers a backend gets (the local supervisor's host lines
    go to `host_line`); inside `with`, a terminal shows the bar.

    `console`: a rich Console to draw on (a test renders one into a string); by default stdout's,
    and off a terminal `plain` and `plain_host` print the lines exactly as without a bar."""

    def __init__(self, console=None, plain: Callable[[str], None] = print,
                 plain_host: Callable[[str, str, str], None] | None = None):
        self._console = console
        self._plain, self._plain_host = plain, plain_host
        self.bar = None
        self._task = None
        self._status = STARTING
        self.last: Progress | None = None

    def _terminal(self) -> bool:
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False)
        return self._console.is_terminal

    def __enter__(self) -> Self:
        global _ACTIVE
        if self._terminal():
            from rich.progress import BarColumn, Progress, TextColumn

            # Our own stdout is redirected above the bar too, so a stray print cannot tear it.
            redirect = self._console.file is sys.stdout
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                console=self._console, redirect_stdout=redirect, redirect_stderr=redirect)
            self.bar.start()
            self._task = self.bar.add_task(self._status, total=None, info="")
            if self.last is not None:
                self._draw(self.last)
        _ACTIVE = self
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        _ACTIVE = None
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    # --- the printers ----------------------------------------------------------------------
    def line(self, text: str) -> None:
        """A log line ('algo-1 | ...', '[algo-1] ...'): printed, and read for progress."""
        if self.bar is not None:
            from rich.text import Text

            self.bar.console.print(Text.from_ansi(self._shown(text)), soft_wrap=True)
        else:
            self._plain(text)
        self._feed(text)

    def host_line(self, label: str, color: str, text: str) -> None:
        """A line of one host of a job this process supervises (launcher.local.supervise.Printer)."""
        if self.bar is not None:
            from rich.text import Text

            self.bar.console.print(Text.assemble((f"{label} |", color), " ", Text.from_ansi(self._shown(text))),
                                   soft_wrap=True)
        else:
            (self._plain_host or console_printer)(label, color, text)
        self._feed(text)

    def _shown(self, text: str) -> str:
        return shown(text, self.last.max_steps if self.last is not None else None)

    # --- the bar ---------------------------------------------------------------------------
    def update(self, status: str) -> None:
        """The job's status in words, left of the bar (rich's Status.update, which it replaces)."""
        self._status = status
        if self.bar is not None:
            self.bar.update(self._task, description=status)

    def _feed(self, text: str) -> None:
        current = from_line(text)
        if current is not None:
            self.last = current
            if self.bar is not None:
                self._draw(current)

    def _draw(self, current: Progress) -> None:
        if self._status == STARTING:
            self.update(TRAINING)
        self.bar.update(self._task, total=current.max_steps, completed=min(current.step, current.max_steps),
                        info=current.text())
