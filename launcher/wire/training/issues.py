"""Validation findings: every error names the field path, the value and the fix."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from launcher.wire.masking import mask_value


def did_you_mean(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """' — did you mean 'x'?' for the closest candidates, or a list of what is allowed."""
    candidates = sorted(set(candidates))
    close = difflib.get_close_matches(str(word), candidates, n=n, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    if len(candidates) <= 12:
        return "allowed: " + ", ".join(repr(c) for c in candidates)
    return ""


def show_value(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Issue:
    """One finding about a job: where (dotted path), what value, what is wrong, how to fix it."""

    path: str
    value: Any
    problem: str
    fix: str = ""
    level: Literal["error", "warning", "info"] = "error"  # info: a note, nothing to fix
    detail: str = ""  # what `validate --verbose` (and --json) adds below the one line

    def __str__(self) -> str:
        text = f"{self.path} = {show_value(mask_value(self.path, self.value))}: {self.problem}"
        return f"{text}; {self.fix}" if self.fix else text

    def to_dict(self) -> dict:
        return {
            "level": self.level,
            "path": self.path,
            "value": mask_value(self.path, self.value),
            "problem": self.problem,
            "fix": self.fix,
            **({"detail": self.detail} if self.detail else {}),
        }


class ConfigError(ValueError):
    """A job description is invalid. `issues` holds every error found, all at once."""

    def __init__(self, issues: list[Issue], source: str | None = None):
        self.issues = [i for i in issues if i.level == "error"]
        self.warnings = [i for i in issues if i.level == "warning"]
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"{len(self.issues)} error(s){where}:"] + [f"  - {i}" for i in self.issues]
        super().__init__("\n".join(lines))


class SourceDirError(ValueError):
    """The source bundle cannot be built; the message names the path or field and the fix."""
