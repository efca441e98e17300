"""Job files: YAML with an optional `extends: base.yaml` chain, plus `--set key=value` overrides.

Paths (`source_dir`, `dependencies`) are relative to the file that sets them; `entry_point`
is relative to source_dir, or to the job file when there is none.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

import yaml

from launcher.config import JobFile, ModelParallelParameters, ValidatedJob, validate_job
from launcher.issues import ConfigError, Issue, did_you_mean

MP_PATH = ("distribution", "smdistributed", "modelparallel", "parameters")


def load_job_file(path: str | Path, overrides: Iterable[str] = ()) -> tuple[dict, Path]:
    """The merged raw job dict (extends resolved, overrides applied) and its base directory."""
    path = Path(path)
    data = _load_chain(path, [])
    apply_overrides(data, overrides)
    return data, path.resolve().parent


def validate_job_file(path: str | Path, overrides: Iterable[str] = ()) -> ValidatedJob:
    data, base = load_job_file(path, overrides)
    job = validate_job(data, base_dir=base, source=str(path), model=JobFile)
    job.config = job.config.model_copy(update={"extends": None})
    return job


def _load_chain(path: Path, seen: list[Path]) -> dict:
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(str(p) for p in seen + [resolved])
        raise ConfigError([Issue("extends", str(path), f"circular extends chain: {chain}",
                                 "remove one of the extends keys")], str(seen[0]))
    data = _read_yaml(path)
    for key in ("source_dir",):
        if isinstance(data.get(key), str):
            data[key] = _absolute(resolved.parent, data[key])
    if isinstance(data.get("dependencies"), list):
        data["dependencies"] = [_absolute(resolved.parent, d) if isinstance(d, str) else d
                                for d in data["dependencies"]]
    base_ref = data.pop("extends", None)
    if base_ref is None:
        return data
    if not isinstance(base_ref, str):
        raise ConfigError([Issue("extends", base_ref, "must be a file path", "extends: base.yaml")],
                          str(path))
    base = _load_chain(resolved.parent / base_ref, seen + [resolved])
    return deep_merge(base, data)


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError([Issue("job file", str(path), "no such file", "check the path")]) from None
    except OSError as exc:
        raise ConfigError([Issue("job file", str(path), f"cannot be read ({exc.strerror})", "")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([Issue("job file", str(path), f"invalid YAML{where}: {problem}",
                                 "fix the YAML syntax")], str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([Issue("job file", str(path), f"top level is a {type(data).__name__}",
                                 "a job file is a mapping of estimator arguments")], str(path))
    return data


def _absolute(base: Path, value: str) -> str:
    if value.startswith(("s3://", "file://")) or Path(value).expanduser().is_absolute():
        return value
    return str((base / value).resolve())


def deep_merge(base: dict, override: dict) -> dict:
    """Mappings merge key by key; anything else in `override` replaces the base value."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_overrides(data: dict, overrides: Iterable[str]) -> None:
    """Apply `a.b.c=value` overrides in place; values are YAML (`8`, `true`, `[1, 2]`).

    A bare model-parallel key (`context_parallel_degree=8`) means the one under
    distribution.smdistributed.modelparallel.parameters.
    """
    issues = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            issues.append(Issue("--set", item, "expected KEY=VALUE",
                                "e.g. --set hyperparameters.fp8=0"))
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        parts = tuple(key.split("."))
        if len(parts) == 1 and parts[0] not in JobFile.model_fields:
            if parts[0] in ModelParallelParameters.model_fields:
                parts = MP_PATH + parts
            else:
                hint = did_you_mean(parts[0], list(JobFile.model_fields) +
                                    list(ModelParallelParameters.model_fields))
                issues.append(Issue("--set", item, f"unknown key {parts[0]!r}", hint))
                continue
        if len(parts) == len(MP_PATH) + 1 and parts[:-1] == MP_PATH:
            mp = data.setdefault("distribution", {}).setdefault("smdistributed", {}) \
                .setdefault("modelparallel", {})
            if isinstance(mp, dict):
                mp.setdefault("enabled", True)
        node = data
        for part in parts[:-1]:
            nxt = node.get(part) if isinstance(node, dict) else None
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                issues.append(Issue("--set", item, f"{part!r} is not a mapping in the job", ""))
                break
            node = nxt
        else:
            node[parts[-1]] = value
    if issues:
        raise ConfigError(issues)
