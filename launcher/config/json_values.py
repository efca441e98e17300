"""A job given as Python values (the estimators, a dict) must be what a job file can hold: the same
limits as launcher.config.safe_yaml puts on YAML, checked on the objects before pydantic reads
them. No NUL or lone surrogate in any text (no variable, argument or path can carry one), no
value that contains itself (json.dumps and pydantic would recurse until RecursionError), nesting
and size within a job file's bounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.config.safe_yaml import MAX_DEPTH, MAX_NODES
from launcher.wire.training.issues import Issue


def value_issues(data: Mapping[str, Any]) -> list[Issue]:
    """The first problem of each top-level field's value, as Issues naming the path."""
    issues = []
    count = [0]
    for key, value in data.items():
        found = _problem(value, str(key), 1, (), count)
        if found is None:
            found = _text_problem(key, str(key))
        if found is not None:
            issues.append(Issue(*found))
    return issues


def _problem(value: Any, path: str, depth: int, ancestors: tuple[int, ...], count: list[int]):
    count[0] += 1
    if count[0] > MAX_NODES:
        return path, "...", f"the job holds more than {MAX_NODES:,} values", "a job is small: remove the bulk"
    if isinstance(value, str):
        return _text_problem(value, path)
    if not isinstance(value, (Mapping, list, tuple)):
        return None
    if id(value) in ancestors:
        return path, "...", "contains itself", "give a value that does not refer to itself (copy it)"
    if depth > MAX_DEPTH:
        return path, "...", f"is nested more than {MAX_DEPTH} levels deep", "flatten the structure"
    inner = (*ancestors, id(value))
    items = value.items() if isinstance(value, Mapping) else enumerate(value)
    for key, item in items:
        where = f"{path}.{key}" if isinstance(value, Mapping) else f"{path}[{key}]"
        found = (_text_problem(key, where) if isinstance(key, str) else None) or _problem(
            item, where, depth + 1, inner, count)
        if found is not None:
            return found
    return None


def _text_problem(text: Any, path: str):
    if not isinstance(text, str):
        return None
    if "\0" in text:
        return path, text, "holds a NUL character (\\0), which no variable, argument or path can carry", "remove it"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return (path, text, "holds a lone surrogate (\\uD800-\\uDFFF), which UTF-8 cannot hold",
                "write the whole character")
    return None
