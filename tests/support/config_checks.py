"""Helpers of the validation-rule tests: a job's issues and their field paths."""

from __future__ import annotations

from launcher.config import ConfigError, validate_job

MP = "distribution.smdistributed.modelparallel.parameters"


def paths(data, level="error"):
    return [i.path for i in issues_of(data, level)]


def only_issue(data, path, level="error"):
    found = [i for i in issues_of(data, level) if i.path == path]
    assert found, f"no {level} at {path}; got {[str(i) for i in issues_of(data, level)]}"
    for issue in found:
        assert issue.fix, f"issue without a fix: {issue}"
    return found


def issues_of(data, level="error"):
    try:
        result = validate_job(data)
    except ConfigError as exc:
        return exc.issues if level == "error" else exc.warnings
    return [] if level == "error" else result.warnings
