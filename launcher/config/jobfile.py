"""Job files: YAML with an optional `extends: base.yaml` chain, plus `--set key=value` overrides.

Paths on this machine are relative to the file that sets them (`PATH_FIELDS`, `dependencies`,
every channel of `inputs`): each file's are made absolute as it is read, so a base file's paths
mean the same from any file that extends it. `entry_point` is relative to source_dir, or to the
file that sets it when no file sets source_dir. `--set` paths are relative to the job file given.
Files and `--set` values are read by launcher.config.safe_yaml (JSON values only, bounded size,
depth and aliases).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from launcher.config import JobFile, ModelParallelParameters, ValidatedJob, validate_job
from launcher.config.safe_yaml import MAX_DEPTH, YamlProblem, loads
from launcher.wire.datafiles import file_kind
from launcher.wire.training.issues import ConfigError, Issue, did_you_mean, show_value

MP_PATH = ("distribution", "smdistributed", "modelparallel", "parameters")
MAX_FILE_BYTES = 256 * 1024  # a job file is a few KiB; more is a wrong file, not a job
MAX_EXTENDS = 16  # files in one extends chain
JOB_FILE_SUFFIXES = (".yaml", ".yml")  # what extends may name
LIST_HINT = "list items cannot be set one by one: set the whole list, e.g. --set 'tags=[{Key: x, Value: y}]'"
# The job's paths on this machine, by their keys; `dependencies` (a list) and `inputs` (a path, or
# channels of paths or of {s3_data: path}) are walked by _anchor_paths. Paths inside the job's
# containers (checkpoint_dir, tensorboard's container_local_output_path, kubernetes.storage.mount_path)
# and the hyperparameters' directories (relative to the code, as the script opens them) are not here.
PATH_FIELDS = (("source_dir",), ("output_path",), ("checkpoint_local_path",), ("slurm", "python"),
               ("kubernetes", "kubeconfig"), ("kubernetes", "storage", "client_path"))


def load_job_file(path: str | Path, overrides: Iterable[str] = ()) -> tuple[dict, Path]:
    """The merged raw job dict (extends resolved, overrides applied) and its base directory."""
    data, base, _files = _load(Path(path), overrides)
    return data, base


def validate_job_file(path: str | Path, overrides: Iterable[str] = ()) -> ValidatedJob:
    data, base, files = _load(Path(path), overrides)
    job = validate_job(data, base_dir=base, source=str(path), model=JobFile)
    job.config = job.config.model_copy(update={"extends": None})
    job.files = tuple(files)
    return job


def _load(path: Path, overrides: Iterable[str]) -> tuple[dict, Path, list[Path]]:
    """What load_job_file returns, and the files of the extends chain (resolved)."""
    files: list[Path] = []
    entry_dir: dict[str, Path] = {}
    data = _load_chain(path, [], files, entry_dir)
    chain_entry = data.get("entry_point")
    apply_overrides(data, overrides)
    base = _resolved(path).parent
    if data.get("entry_point") == chain_entry and not data.get("source_dir"):  # not --set, no source_dir
        _anchor_entry_point(data, entry_dir.get("entry_point"), base, path)
    return data, base, files


def _anchor_entry_point(data: dict, where: Path | None, base: Path, source: Path) -> None:
    """Without source_dir, entry_point is relative to the file that set it: a base file elsewhere
    makes it absolute (the job file's own stays as written, relative to `base`)."""
    if where is not None and where != base and isinstance(data.get("entry_point"), str):
        data["entry_point"] = _absolute(where, data["entry_point"], "entry_point", source)


def _load_chain(path: Path, seen: list[Path], files: list[Path], entry_dir: dict[str, Path]) -> dict:
    """The file's data merged over its bases', its paths made absolute; `entry_dir` gets the
    directory of the file whose entry_point the chain keeps."""
    resolved = _resolved(path)
    if resolved in seen:
        chain = " -> ".join(str(p) for p in seen + [resolved])
        raise ConfigError([Issue("extends", str(path), f"circular extends chain: {chain}",
                                 "remove one of the extends keys")], str(seen[0]))
    if len(seen) >= MAX_EXTENDS:
        raise ConfigError([Issue("extends", str(path), f"the extends chain is longer than {MAX_EXTENDS} files",
                                 "merge some of the base files")], str(seen[0]))
    if seen and resolved.suffix.lower() not in JOB_FILE_SUFFIXES:  # read as a base: refused before it is read
        raise ConfigError([Issue("extends", str(path), "is not a YAML job file (.yaml or .yml)",
                                 "extends names another job file")], str(seen[-1]))
    data = _read_yaml(path)
    if seen:
        _check_base_keys(data, path, seen[-1])
    files.append(resolved)
    _anchor_paths(data, resolved.parent, path)
    base_ref = data.pop("extends", None)
    base: dict = {}
    if base_ref is not None:
        if not isinstance(base_ref, str) or not base_ref:
            raise ConfigError([Issue("extends", base_ref, "must be a file path", "extends: base.yaml")],
                              str(path))
        base = _load_chain(resolved.parent / base_ref, seen + [resolved], files, entry_dir)
    if "entry_point" in data:  # after the bases': this file's entry_point is the one kept
        entry_dir["entry_point"] = resolved.parent
    return deep_merge(base, data) if base_ref is not None else data


def _anchor_paths(data: dict, directory: Path, source: Path) -> None:
    """This file's relative paths on this machine, made absolute against its directory."""
    for keys in PATH_FIELDS:
        node = data
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(keys[-1]), str):
            node[keys[-1]] = _absolute(directory, node[keys[-1]], ".".join(keys), source)
    if isinstance(data.get("dependencies"), list):
        data["dependencies"] = [_absolute(directory, d, f"dependencies[{i}]", source) if isinstance(d, str)
                                else d for i, d in enumerate(data["dependencies"])]
    inputs = data.get("inputs")
    if isinstance(inputs, str):
        data["inputs"] = _absolute(directory, inputs, "inputs", source)
    elif isinstance(inputs, dict):
        for name, channel in inputs.items():
            if isinstance(channel, str):
                inputs[name] = _absolute(directory, channel, f"inputs.{name}", source)
            elif isinstance(channel, dict) and isinstance(channel.get("s3_data"), str):
                channel["s3_data"] = _absolute(directory, channel["s3_data"], f"inputs.{name}.s3_data", source)


def _check_base_keys(data: dict, path: Path, child: Path) -> None:
    """A base file whose keys are not job fields is not a job file: refused by its key names alone,
    so that no value of a file extends should not have named is ever shown."""
    unknown = [str(key) for key in data if key not in JobFile.model_fields and key != "extends"]
    if unknown:
        shown = ", ".join(repr(key) for key in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise ConfigError([Issue("extends", str(path), f"is not a job file: {len(unknown)} key(s) are not job "
                                 f"fields ({shown}); its values are not shown",
                                 "extends names another job file; fix or remove the keys")], str(child))


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, or a path the system refuses
        raise ConfigError([Issue("job file", str(path), f"cannot be resolved ({exc})", "check the path")]) from None


def _read_yaml(path: Path) -> dict:
    try:
        data = loads(_read_text(path))
    except YamlProblem as exc:
        raise ConfigError([Issue("job file", str(path), exc.problem, exc.fix)], str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([Issue("job file", str(path), f"top level is a {type(data).__name__}",
                                 "a job file is a mapping of estimator arguments")], str(path))
    return data


def _read_text(path: Path) -> str:
    """The file's text: a regular file (not a device or FIFO, which never end), small, UTF-8."""
    def refuse(problem: str, fix: str) -> ConfigError:
        return ConfigError([Issue("job file", str(path), problem, fix)], str(path))

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO would block here without O_NONBLOCK
    except FileNotFoundError:
        raise refuse("no such file", "check the path") from None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})", "check the path and its permissions") from None
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind:
            os.close(fd)
            raise refuse(f"is {kind}, not a file", "give the path of a YAML job file")
        with open(fd, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})", "check the path and its permissions") from None
    if len(raw) > MAX_FILE_BYTES:
        raise refuse(f"is larger than {MAX_FILE_BYTES // 1024} KiB", "a job file is small: is this the right file?")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise refuse(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                     "save it as UTF-8, or check that it is the job file") from None


def _absolute(base: Path, value: str, field: str, source: Path) -> str:
    """A path relative to `base` made absolute (file:// kept); S3 URIs, absolute and ~ paths as given."""
    if value.startswith("s3://"):
        return value
    scheme, plain = ("file://", value[7:]) if value.startswith("file://") else ("", value)
    try:
        path = Path(plain).expanduser()
    except RuntimeError:  # ~name of no user, or ~ without a home directory
        raise ConfigError([Issue(field, value, f"{plain.split('/')[0]} names no user with a home directory",
                                 "write the path out in full")], str(source)) from None
    if not plain or path.is_absolute():
        return value
    try:
        return scheme + str((base / plain).resolve())
    except (OSError, RuntimeError):  # a symlink loop, a name too long: validation names the field
        return scheme + os.path.normpath(base / plain)


# Mappings that are one value, which a file replaces whole: a sweep's ranges are its search space, and
# a base's ranges merged into the extending file's would tune hyperparameters that file does not name.
WHOLE_MAPPINGS = {("tuning", "ranges")}


def deep_merge(base: dict, override: dict, _where: tuple[str, ...] = ()) -> dict:
    """Mappings merge key by key (but WHOLE_MAPPINGS); anything else in `override` replaces the base value."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        where = (*_where, key)
        if isinstance(value, dict) and isinstance(out.get(key), dict) and where not in WHOLE_MAPPINGS:
            out[key] = deep_merge(out[key], value, where)
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
        issue = _apply_override(data, item)
        if issue is not None:
            issues.append(issue)
    if issues:
        raise ConfigError(issues)


@lru_cache(maxsize=4096)
def _override_value(text: str):
    """An override's value parsed once per text: `plan --auto` applies the same few values to
    thousands of configurations, and a YAML parse (pure Python) was a quarter of its time."""
    return loads(text) if text.strip() else ""


def _apply_override(data: dict, item: str) -> Issue | None:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        return Issue("--set", item, "expected KEY=VALUE", "e.g. --set hyperparameters.fp8=0")
    parts = tuple(p.strip() for p in key.split("."))
    if not all(parts):
        return Issue("--set", item, f"the key {key!r} has an empty part",
                     "write a.b.c: no '..', no leading or trailing '.'")
    if any(c in key for c in "[]"):
        return Issue("--set", item, f"the key {key!r} indexes a list", LIST_HINT)
    if len(parts) > MAX_DEPTH:
        return Issue("--set", item, f"the key has more than {MAX_DEPTH} parts", "set a shorter path")
    if len(parts) == 1 and parts[0] not in JobFile.model_fields:
        if parts[0] not in ModelParallelParameters.model_fields:
            hint = did_you_mean(parts[0], list(JobFile.model_fields) + list(ModelParallelParameters.model_fields))
            return Issue("--set", item, f"unknown key {parts[0]!r}", hint)
        parts = MP_PATH + parts
    try:
        value = copy.deepcopy(_override_value(text))  # a copy: the job data may be changed in place later
    except YamlProblem as exc:
        return Issue("--set", item, f"in the value: {exc.problem}", f"{exc.fix}, or quote the value: "
                     f"--set '{key}=\"...\"'")
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            where = ".".join(parts[:i + 1])
            hint = LIST_HINT if isinstance(nxt, list) else f"set {where} as a whole (--set '{where}={{...}}')"
            return Issue("--set", item, f"{where} is {show_value(nxt)}, not a mapping, so it has no key "
                         f"{parts[i + 1]!r}", hint)
        node = nxt
    node[parts[-1]] = value
    if parts[:-1] == MP_PATH:  # setting an SMP parameter means using SMP
        data["distribution"]["smdistributed"]["modelparallel"].setdefault("enabled", True)
    return None
