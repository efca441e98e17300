"""A job's `metric_definitions` applied to its log, as SageMaker applies them (docs/metrics.md):
what `smlaunch metrics`, `status` and the plots show of a local or Slurm job whose script writes
no metrics.jsonl (a user's own script).

SageMaker's semantics: every definition's `Regex` is searched in every line the algorithm writes
(each host's output); a match's first group, read as a number, is one value of the metric named
`Name`; a match whose group is not a number adds nothing. Locally the lines are logs/job.log's,
without the `algo-N | ` prefix the merge adds (so `^` means the script's line start, as in
CloudWatch). SageMaker stamps each value with the line's time; job.log keeps no time per line, so
the values are numbered instead: `point` is a value's position among its metric's values (1, 2, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_HOST_PREFIX = re.compile(r"^algo-\d+ \| ")
POINT = "point"


def compile_definitions(definitions: Iterable[dict]) -> list[tuple[str, re.Pattern]]:
    """(Name, compiled Regex) of each definition whose regex compiles (validation refuses the others)."""
    out = []
    for definition in definitions:
        try:
            out.append((definition["Name"], re.compile(definition["Regex"])))
        except (KeyError, re.error):
            continue
    return out


def metrics_from_lines(lines: Iterable[str], definitions: Iterable[dict]) -> list[dict]:
    """One record per value found: {"point": n, Name: value}, in the order of the lines."""
    compiled = compile_definitions(definitions)
    counts: dict[str, int] = {}
    records = []
    for line in lines:
        text = _HOST_PREFIX.sub("", line.rstrip("\n"))
        for name, regex in compiled:
            match = regex.search(text)
            if match is None or not match.groups():
                continue
            try:
                value = float(match.group(1))
            except (TypeError, ValueError):
                continue
            counts[name] = counts.get(name, 0) + 1
            records.append({POINT: counts[name], name: value})
    return records


def metrics_from_log(path: Path, definitions: Iterable[dict]) -> list[dict]:
    """metrics_from_lines over a log file (no records when it does not exist yet)."""
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", errors="replace") as f:
        return metrics_from_lines(f, definitions)
