"""A job's `metric_definitions` applied to its log, as SageMaker applies them (docs/metrics.md):
what `smlaunch metrics`, `status`, the plots and a sweep's objective show of a local, Slurm or
Kubernetes job whose script writes no metrics.jsonl (a user's own script).

SageMaker's semantics: every definition's `Regex` is searched in every line the algorithm writes
(each host's output); a match's first group, read as a number, is one value of the metric named
`Name`; a match whose group is not a number adds nothing. Locally the lines are logs/job.log's,
without the `algo-N | ` prefix the merge adds (so `^` means the script's line start, as in
CloudWatch). SageMaker stamps each value with the line's time; job.log keeps no time per line, so
the values are numbered instead: `point` is a value's position among its metric's values (1, 2, ...).

A regex is the user's and the log is the script's: a pattern that backtracks (`((?:[0-9.]+)+)x`
over a long line of digits) would take hours on Python's `re`. So the regexes run on the `regex`
module, whose searches take a time limit: a definition whose search runs past MATCH_TIMEOUT_S on a
line is given up for the rest of the log, and the readers say so (`given_up`). And a log is read on
from where the last read stopped (`LogMetrics.read`), so a sweep's controller reads each line once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import regex

_HOST_PREFIX = re.compile(r"^algo-\d+ \| ")
POINT = "point"
# A search of one line: microseconds for a regex that does not backtrack, whatever the line's length
# in a log; a pattern that does is cut off here, once per definition and log.
MATCH_TIMEOUT_S = 0.5


class LogMetrics:
    """The values `definitions` find in a log's lines, fed in order (`feed`, or `read` from a file,
    on from where the last read stopped). `records`: one per value found, {"point": n, Name: value};
    `given_up`: Name -> why that definition reads no more."""

    def __init__(self, definitions: Iterable[dict]):
        self.compiled: list[tuple[str, regex.Pattern]] = []
        self.given_up: dict[str, str] = {}
        for definition in definitions:
            try:
                self.compiled.append((definition["Name"], regex.compile(definition["Regex"])))
            except regex.error as exc:  # validation compiles with re, which accepts what regex does
                self.given_up[definition["Name"]] = f"its Regex does not compile ({exc})"
        self.records: list[dict] = []
        self.counts: dict[str, int] = {}
        self.lines = 0
        self.offset = 0  # bytes of the file read so far (read)

    def feed(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.lines += 1
            self._line(_HOST_PREFIX.sub("", line.rstrip("\n")))

    def _line(self, text: str) -> None:
        for name, pattern in list(self.compiled):
            try:
                match = pattern.search(text, timeout=MATCH_TIMEOUT_S)
            except TimeoutError:
                self.compiled.remove((name, pattern))
                self.given_up[name] = (f"its Regex searched line {self.lines} of the log for over {MATCH_TIMEOUT_S} s "
                                       "(a pattern that backtracks, such as a repeat inside a repeat: (x+)+), so no "
                                       "value of it is read from there on; rewrite it without nested repeats")
                continue
            if match is None or not match.groups():
                continue
            try:
                value = float(match.group(1))
            except (TypeError, ValueError):
                continue
            self.counts[name] = self.counts.get(name, 0) + 1
            self.records.append({POINT: self.counts[name], name: value})

    def read(self, path: Path, final: bool = True) -> None:
        """Feed the lines of `path` past those already read; `final`: the last line too when it has no
        newline yet (the job has ended), else it waits for the next read. No file yet: nothing."""
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self.offset)
            for raw in f:
                if not final and not raw.endswith(b"\n"):  # being written: the next read takes it whole
                    break
                self.offset += len(raw)
                # as text mode reads a file: \r ends a line too (a progress bar redraws with it)
                text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
                self.feed(text.removesuffix("\n").split("\n"))

    def note(self) -> str:
        """What the readers add to where the values come from: the definitions given up, and why."""
        return "".join(f"; {name}: {why}" for name, why in self.given_up.items())


def metrics_from_lines(lines: Iterable[str], definitions: Iterable[dict]) -> list[dict]:
    """One record per value found, in the order of the lines."""
    found = LogMetrics(definitions)
    found.feed(lines)
    return found.records
