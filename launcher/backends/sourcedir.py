"""Build the ``sourcedir.tar.gz`` a SageMaker training job downloads into its code directory.

Layout follows the SageMaker Python SDK v2 (``sagemaker.fw_utils.tar_and_upload_dir``):

- with ``source_dir``, its contents sit at the archive root and ``entry_point`` is a path
  relative to it; without it, the ``entry_point`` file alone sits at the root;
- every ``dependencies`` path (file or directory) sits at the root under its basename;
- every ``include_packages`` name (an importable package, found without importing it) sits
  under ``packages_dir`` (``_smlaunch/``), a name no user package can be imported by, so it
  shadows none of the user's; a dotted name ships that subpackage and its parents' ``__init__.py``.
  Only a job that runs smlaunch's runtime ships smlaunch's ``container`` and the launcher's
  ``config`` and ``wire`` (``build_job_sourcedir``), and its ``train.py`` puts
  ``_smlaunch/`` first on its path. A user script's bundle holds its own code and nothing of
  smlaunch: AWS's images run it with their own toolkit, smlaunch's image and the local and
  Slurm runners with the bootstrap they have, and the script imports none of it. The one
  exception: a SageMaker job with ``max_restarts`` ships the restart loop that AWS's toolkit runs
  in place of torchrun (``_smlaunch/restart_loop.py`` and what it imports, ``RESTART_LOOP_PACKAGES``;
  launcher.wire.restart_loop), for a user script too. (With
  ``packages_dir=""`` the packages sit at the root, and one the job already ships is left out.)

A job that runs smlaunch's runtime on SageMaker also gets a ``requirements.txt`` at the archive
root, which the image's toolkit installs with pip before training: what the runtime imports
beyond the image's PyTorch (``RUNTIME_DISTRIBUTIONS``), with the versions smlaunch itself
requires. A ``requirements.txt`` the job already ships is kept and the runtime's lines the user
does not name are appended to it; the user's own lines win. Local jobs get none: the process
runner uses this machine's Python, the Docker runner smlaunch's image, both of which have them,
and pip would otherwise reach for the network. User scripts get none either.

Unlike the SDK, ``ignore`` patterns (fnmatch on each path component's basename) keep ``.git``,
virtualenvs and caches out, and the archive is reproducible: sorted entries, one fixed
mtime, root ownership, normalised modes and a zeroed gzip timestamp, so the same tree always
gives the same bytes (and the same sha256) with the same zlib.

Also unlike the SDK (which ships whatever the directory holds), credential files
(``launcher.wire.masking.CREDENTIAL_PATTERNS``: ``.env*``, ``.ssh/``, ``.aws/``, ``id_rsa*``, ``*.key``,
``.netrc``, ...) are left out of every tree whatever ``ignore`` says, and the bundle lists them
(``excluded``). The one way to ship such a file is to name the file itself in ``dependencies``: a
deliberate choice, which a note repeats. An archive over LARGE_BUNDLE_BYTES gets a note naming
its largest files. Notes are logged as warnings (every caller shows them) and kept in ``notes``.

Symlinks are followed when their target lies inside the tree being added (``source_dir``, the
dependency directory or the package directory): the archive stores the target's content as a
plain file or directory, which any extractor accepts. A link that points outside the tree, is
broken or loops is refused with an error, since the container would receive a dangling link.
Trees are walked by launcher.config.code_tree, with which validate checks the job's trees too.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import logging
import os
import re
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from launcher.config.code_rules import job_state
from launcher.config.code_tree import (
    DEFAULT_IGNORE,
    a_credential,
    ignored_by,
    job_ignore,
    resolved,
    walk,
)
from launcher.config.job_rules import outside_source_dir
from launcher.config.requirements import REQUIREMENTS, runtime_requirements, with_requirements
from launcher.plan.prediction import prediction
from launcher.wire import job_plan, restart_loop
from launcher.wire.masking import MIN_SECRET_LENGTH, credential_pattern, secret_values
from launcher.wire.runtime_script import PACKAGES_DIR
from launcher.wire.training.issues import SourceDirError

log = logging.getLogger(__name__)


# Every host downloads the archive before training: data belongs in an input channel.
LARGE_BUNDLE_BYTES = 100_000_000
LARGEST_SHOWN = 5  # files named in the note about a large archive

# Included packages (smlaunch's own, for a job that runs its runtime) sit in the archive under
# PACKAGES_DIR (launcher.wire.runtime_script). RUNTIME_PACKAGES are what smlaunch's runtime imports.
# The training container imports of the launcher only the contract, wire/ (docs/architecture.md; the
# import tests hold it): the client's job schema, rules, backends, CLI, SDK and planner stay home.
RUNTIME_PACKAGES = ("container", "launcher.wire")
# A SageMaker job with max_restarts: AWS's toolkit runs RESTART_LOOP_PROGRAM in place of torchrun
# (launcher.wire.restart_loop), which imports these (the bootstrap: the standard library and wire).
RESTART_LOOP_PACKAGES = ("container.toolkit", "launcher.wire")
RESTART_LOOP_PROGRAM = f"{PACKAGES_DIR}/{restart_loop.SCRIPT}"

# 2020-09-13. Not 0: ZIP cannot store dates before 1980, so a user re-zipping the extracted
# code directory would fail on epoch-0 files.
ARCHIVE_MTIME = 1_600_000_000

# archive name -> (file whose bytes are stored, the bytes themselves, or None for a directory; mode)
_Entries = dict[str, tuple[Path | bytes | None, int]]


@dataclass
class SourceBundle:
    path: Path
    sha256: str
    size_bytes: int
    files: list[str]
    """Archive names of the regular files, sorted."""
    entry_point: str
    """The entry point's name inside the archive (what ``sagemaker_program`` must name)."""
    skipped_packages: list[str] = field(default_factory=list)
    """``include_packages`` left out because the job already ships a copy."""
    added_requirements: list[str] = field(default_factory=list)
    """Lines added to (or written as) the archive's requirements.txt."""
    excluded: list[str] = field(default_factory=list)
    """Archive paths left out as credential files (a directory ends with '/'), sorted."""
    left_out: list[str] = field(default_factory=list)
    """Archive paths left out as the job's own files or smlaunch's state (``never_ship``), sorted."""
    notes: list[str] = field(default_factory=list)
    """What the user should know: exclusions, a credential file shipped, a large archive."""
    smlaunch: str = "nothing of smlaunch"
    """What of smlaunch the archive holds, and why (``build_job_sourcedir``)."""

    def summary(self) -> str:
        """The line `smlaunch submit` prints: file count, size, and what of smlaunch ships."""
        return f"{self.path.name}: {len(self.files)} files, {_size(self.size_bytes)}; {self.smlaunch}"

    def to_dict(self) -> dict:
        """The dry run's `SourceBundle`."""
        return {"files": len(self.files), "bytes": self.size_bytes, "sha256": self.sha256, "smlaunch": self.smlaunch}


def _size(size: int) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def build_sourcedir(
    dest: Path,
    *,
    entry_point: str | Path,
    source_dir: str | Path | None,
    dependencies: Sequence[str | Path] = (),
    include_packages: Sequence[str] = (),
    packages_dir: str = PACKAGES_DIR,
    ignore: Sequence[str] = DEFAULT_IGNORE,
    requirements: Sequence[str] = (),
    never_ship: Sequence[str | Path] = (),
    secrets: Mapping[str, str] | None = None,
    generated: Mapping[str, bytes] | None = None,
) -> SourceBundle:
    """Write the job's code archive to ``dest`` (a file path) and describe it. ``include_packages``
    go under ``packages_dir`` (at the root if it is ""). ``requirements`` go into the archive's
    requirements.txt, after the lines of one the code already has. ``never_ship``: files and
    directories left out wherever they lie in the trees (the job's own files, smlaunch's state),
    with a note. ``secrets`` (value -> where the job sets it): the user's code must hold none of
    these values, or the archive is refused. ``generated`` (archive name -> bytes): files smlaunch
    writes for the job, e.g. the plan's prediction under ``packages_dir``."""
    dest = Path(dest)
    if dest.is_dir():
        raise SourceDirError(
            f"dest '{dest}' is a directory: pass the archive's file path, "
            f"e.g. '{dest / 'sourcedir.tar.gz'}'"
        )
    # A previous archive written inside source_dir must not end up inside the next one.
    exclude = _Exclude(dest.resolve(), frozenset(resolved(Path(p)) for p in never_ship))
    entries: _Entries = {}
    origins: dict[str, str] = {}  # top-level archive name -> what provided it, for messages
    excluded: list[str] = []  # credential files and directories left out
    notes: list[str] = []

    if source_dir is not None:
        src = Path(source_dir)
        if not src.is_dir():
            raise SourceDirError(
                f"source_dir '{src}' is not a directory: pass an existing directory, "
                "or None to ship entry_point alone"
            )
        tree: _Entries = {}
        _add_tree(tree, src, "", ignore, exclude, excluded)
        _merge(entries, origins, tree, f"source_dir '{src}'")
        program = _program_in(src, entry_point, entries, ignore)
    else:
        script = Path(entry_point)
        if not script.is_file():
            raise SourceDirError(
                f"entry_point '{script}' is not a file: pass an existing script, or set "
                "source_dir and pass a path relative to it"
            )
        program = script.name
        _merge(entries, origins, {program: _file_entry(script)}, f"entry_point '{script}'")

    for dep in map(Path, dependencies):
        if not dep.exists():
            raise SourceDirError(
                f"dependency '{dep}' does not exist: pass an existing file or directory"
            )
        # abspath, not resolve: '.' gets its directory's name, a symlink keeps its own name.
        name = Path(os.path.abspath(dep)).name
        _merge(entries, origins, _collect(dep, name, ignore, exclude, excluded), f"dependency '{dep}'")
        real = dep.resolve()
        pattern = (credential_pattern("/".join(Path(os.path.abspath(dep)).parts[-2:]))
                   or credential_pattern("/".join(real.parts[-2:])))
        if pattern and real.is_file():
            notes.append(f"dependency '{dep}' matches credential pattern '{pattern}' and is shipped as "
                         f"'{name}', since dependencies name it: drop it if that was not meant")

    if secrets:  # the user's code only: smlaunch's packages below are this installation's own files
        _refuse_secrets(entries, secrets)
    skipped: list[str] = []
    for package in include_packages:
        top = package.split(".", 1)[0]
        if not packages_dir and top in origins and origins[top] != f"include_packages entry '{top}'":
            skipped.append(package)
            continue
        part = _package_entries(package, ignore, exclude, excluded)
        if packages_dir:
            part = {f"{packages_dir}/{name}": entry for name, entry in part.items()}
            part[packages_dir] = (None, 0o755)
        # the parts of one package (say launcher.config and launcher.wire) share its top-level name
        origin = "smlaunch's packages" if packages_dir else f"include_packages entry '{top}'"
        _merge(entries, origins, part, origin)

    added = _add_requirements(entries, requirements)
    for name, content in (generated or {}).items():
        _merge(entries, origins, {name: (content, 0o644)}, "smlaunch's packages")
    names = _write(dest, entries)
    digest, size = _sha256(dest)
    if excluded:
        notes.insert(0, f"left out of {dest.name} as credential files: {', '.join(sorted(excluded))} "
                        "(pass secrets as environment or hyperparameters; docs/secrets.md)")
    if exclude.found:
        notes.insert(0, f"left out of {dest.name} as the job's own files or smlaunch's state (job files, "
                        f"SMLAUNCH_HOME, local output and checkpoints): {', '.join(sorted(exclude.found))}")
    if size > LARGE_BUNDLE_BYTES:
        notes.append(_large_note(dest, size, entries))
    for note in notes:
        log.warning("%s", note)
    return SourceBundle(
        path=dest,
        sha256=digest,
        size_bytes=size,
        files=[n for n in names if entries[n][0] is not None],
        entry_point=program,
        skipped_packages=skipped,
        added_requirements=added,
        excluded=sorted(excluded),
        left_out=sorted(exclude.found),
        notes=notes,
    )


def _large_note(dest: Path, size: int, entries: _Entries) -> str:
    sizes = {name: len(source) if isinstance(source, bytes) else source.stat().st_size
             for name, (source, _mode) in entries.items() if source is not None}
    largest = sorted(sizes, key=lambda n: (-sizes[n], n))[:LARGEST_SHOWN]
    listed = ", ".join(f"{n} ({sizes[n] / 1e6:.1f} MB)" for n in largest)
    return (f"{dest.name} is {size / 1e6:.1f} MB (over {LARGE_BUNDLE_BYTES / 1e6:g} MB), and every host "
            f"downloads it before training; largest files: {listed}. Leave data out with source_ignore "
            "and pass it as an input channel")


def _add_requirements(entries: _Entries, lines: Sequence[str]) -> list[str]:
    if not lines:
        return []
    source, mode = entries.get(REQUIREMENTS, (b"", 0o644))
    if source is None:
        raise SourceDirError(f"the code has a directory named {REQUIREMENTS}, where the toolkit expects a "
                             "file: rename it")
    text, added = with_requirements((source if isinstance(source, bytes) else source.read_bytes()).decode(), lines)
    if added:
        entries[REQUIREMENTS] = (text.encode(), mode)
    return added


@dataclass
class _Exclude:
    """What no tree contributes: the archive being written, and ``never_ship``'s paths (the
    archive names of those met are kept for the note)."""

    dest: Path
    never_ship: frozenset[Path]
    found: list[str] = field(default_factory=list)

    def __call__(self, real: Path, arcname: str) -> bool:
        if real in self.never_ship:
            self.found.append(arcname + "/" if real.is_dir() else arcname)
            return True
        return real == self.dest


def _refuse_secrets(entries: _Entries, secrets: Mapping[str, str]) -> None:
    """Refuse the archive if a file of it holds one of the job's secret values (a config file, a
    notebook's output cell, a copy of the job file under another name): the archive is not private
    (docs/secrets.md)."""
    values = sorted((v for v in secrets if len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)
    if not values:
        return
    pattern = re.compile(b"|".join(re.escape(v.encode()) for v in values))
    longest = max(map(len, (v.encode() for v in values)))
    for name in sorted(entries):
        source = entries[name][0]
        if source is None:
            continue
        found = pattern.search(source) if isinstance(source, bytes) else _search_file(source, pattern, longest)
        if found:
            where = secrets[found.group().decode()]
            raise SourceDirError(
                f"'{name}' in the code holds the value of {where}, a secret of this job, and the code archive "
                f"is not private: take the value out of that file, add the file to source_ignore, or rename "
                f"it as a credential file (docs/secrets.md)")


def _search_file(path: Path, pattern: re.Pattern[bytes], longest: int) -> re.Match[bytes] | None:
    """The first match in a file read in pieces (a data file may be large); pieces overlap by
    less than a secret so that one cut in two is still found."""
    tail = b""
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            data = tail + chunk
            if found := pattern.search(data):
                return found
            tail = data[-(longest - 1):] if longest > 1 else b""
    return None


def job_secrets(cfg) -> dict[str, str]:
    """The job's secret values (launcher.wire.masking.secret_values: secret-named keys, URL
    passwords), each with the field that sets it, e.g. {'hf_x...': 'environment.HF_TOKEN'}."""
    hyperparameters = cfg.hyperparameters.model_dump(mode="json", exclude_none=True)
    found: dict[str, str] = {}
    for section, values in (("environment", cfg.environment), ("hyperparameters", hyperparameters)):
        for key, value in values.items():
            for secret in secret_values({key: value}):
                found.setdefault(secret, f"{section}.{key}")
    return found


def _collect(path: Path, name: str, ignore: Sequence[str], exclude: _Exclude, excluded: list[str]) -> _Entries:
    """Entries for one file or directory stored at the archive root as ``name``."""
    real = path.resolve()
    if real.is_file():
        return {name: _file_entry(real)}
    entries: _Entries = {name: (None, 0o755)}
    _add_tree(entries, path, name, ignore, exclude, excluded)
    return entries


def _add_tree(
    entries: _Entries, root: Path, prefix: str, ignore: Sequence[str], exclude: _Exclude, excluded: list[str]
) -> None:
    """The tree's entries as launcher.config.code_tree walks it, less what `exclude` leaves out and the
    credential files (their archive names added to `excluded`)."""
    real_root = root.resolve()

    def keep(path: Path, real: Path, arcname: str) -> bool:
        if exclude(real, arcname):
            return False
        if a_credential(real_root, path, real, arcname):
            excluded.append(arcname + "/" if real.is_dir() else arcname)
            return False
        return True

    for arcname, real in walk(root, prefix, ignore, keep):
        entries[arcname] = (None, 0o755) if real.is_dir() else _file_entry(real)


def _file_entry(path: Path) -> tuple[Path, int]:
    executable = path.stat().st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path, 0o755 if executable else 0o644


def _merge(entries: _Entries, origins: dict[str, str], part: _Entries, origin: str) -> None:
    for name in part:
        top = name.split("/", 1)[0]
        if top in origins and origins[top] != origin:
            raise SourceDirError(
                f"{origin} would be stored as '{top}', which {origins[top]} already "
                "provides: rename one of them or drop one"
            )
        origins[top] = origin
    entries.update(part)


def _program_in(
    source_dir: Path, entry_point: str | Path, entries: _Entries, ignore: Sequence[str]
) -> str:
    rel = PurePosixPath(str(entry_point))
    if outside_source_dir(str(entry_point)):
        raise SourceDirError(
            f"entry_point '{entry_point}' must be a path relative to source_dir "
            f"'{source_dir}' (e.g. 'train.py'), inside it"
        )
    name = rel.as_posix()
    if name in entries and entries[name][0] is not None:
        return name
    blocked = next(filter(None, (ignored_by(part, ignore) for part in rel.parts)), None)
    if blocked and (source_dir / rel).is_file():
        raise SourceDirError(
            f"entry_point '{entry_point}' is excluded by ignore pattern '{blocked}': rename "
            "the script or drop the pattern from ignore"
        )
    parts = rel.parts
    credential = next(filter(None, (credential_pattern("/".join(parts[:i + 1]), i < len(parts) - 1)
                                    for i in range(len(parts)))), None)
    if credential and (source_dir / rel).is_file():
        raise SourceDirError(
            f"entry_point '{entry_point}' is left out as a credential file (pattern '{credential}'): "
            "rename the script"
        )
    raise SourceDirError(
        f"entry_point '{entry_point}' not found in source_dir '{source_dir}': pass a path "
        "relative to source_dir"
    )


def _package_entries(package: str, ignore: Sequence[str], exclude: _Exclude, excluded: list[str]) -> _Entries:
    """A package's entries under its own name; a dotted name (`launcher.config`) is that subpackage
    with the `__init__.py` of each package above it, and nothing else of them."""
    top, *subs = package.split(".")
    if not subs:
        return _collect(_package_dir(top), top, ignore, exclude, excluded)
    directory, name = _package_dir(top), top
    entries: _Entries = {}
    for sub in subs:
        if not sub.isidentifier():
            raise SourceDirError(f"include_packages entry '{package}' is not a package name: pass a name "
                                 "such as 'container' or 'launcher.config'")
        entries[name] = (None, 0o755)
        entries[f"{name}/__init__.py"] = _file_entry(directory / "__init__.py")
        directory, name = directory / sub, f"{name}/{sub}"
    if not (directory / "__init__.py").is_file():
        raise SourceDirError(f"include_packages entry '{package}' is not a regular package ({directory} has no "
                             "__init__.py)")
    entries.update(_collect(directory, name, ignore, exclude, excluded))
    return entries


def _package_dir(name: str) -> Path:
    if not name.isidentifier():
        raise SourceDirError(
            f"include_packages entry '{name}' is not a top-level package name: pass a name "
            "such as 'container'"
        )
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SourceDirError(
            f"include_packages entry '{name}' is not importable here: install it "
            "(pip install -e .) or remove it from include_packages"
        )
    if spec.origin is None or Path(spec.origin).name != "__init__.py":
        raise SourceDirError(
            f"include_packages entry '{name}' is not a regular package (found "
            f"{spec.origin or 'a namespace package'}): only a directory with __init__.py "
            "can be bundled"
        )
    return Path(spec.origin).parent


def _write(dest: Path, entries: _Entries) -> list[str]:
    # Sorting on path components puts every directory before its contents.
    names = sorted(entries, key=lambda n: n.split("/"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    # filename="" and mtime=0 keep the gzip header free of the name and the build time.
    with open(dest, "wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0
    ) as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            source, mode = entries[name]
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = ARCHIVE_MTIME, mode
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if source is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(source, bytes):
                info.size = len(source)
                tar.addfile(info, io.BytesIO(source))
            else:
                info.size = source.stat().st_size
                with open(source, "rb") as fh:
                    tar.addfile(info, fh)
    return names


def _sha256(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def build_job_sourcedir(job, dest: Path) -> SourceBundle:
    """The archive of a validated job (`launcher.config.ValidatedJob`), paths relative to its file.

    What of smlaunch it holds depends on the job's kind (launcher.config.job_kind), whatever the
    target: a job that runs smlaunch's runtime ships `container` and `launcher` under
    `_smlaunch/`, which its train.py imports (on AWS's images they are nowhere else; on smlaunch's
    image, locally and on Slurm the job so runs the code it was validated with); a user script
    ships nothing of smlaunch, since whatever runs it (AWS's toolkit in AWS's images, smlaunch's
    bootstrap in smlaunch's image, on this machine or on the Slurm nodes) is already where it runs,
    and the script itself imports none of it."""
    cfg, base = job.config, job.base_dir
    source_dir = None if cfg.source_dir is None else base / cfg.source_dir
    entry = cfg.entry_point if source_dir else str(base / cfg.entry_point)
    requirements = runtime_requirements() if job.kind.runtime and cfg.on_sagemaker else ()
    loop = uses_restart_loop(cfg)
    packages = RUNTIME_PACKAGES if job.kind.runtime else RESTART_LOOP_PACKAGES if loop else ()
    generated = {}
    if job.kind.runtime:  # the trackers show the plan's prediction beside the measured figures (wire.job_plan)
        generated[f"{PACKAGES_DIR}/{job_plan.FILE}"] = job_plan.encode(prediction(job))
    if loop:
        generated[RESTART_LOOP_PROGRAM] = restart_loop.STUB
    bundle = build_sourcedir(dest, entry_point=entry, source_dir=source_dir,
                             dependencies=[base / d for d in cfg.dependencies], include_packages=packages,
                             ignore=job_ignore(cfg), requirements=requirements,
                             never_ship=never_shipped(job), secrets=job_secrets(cfg), generated=generated)
    shipped = sum(name.startswith(f"{PACKAGES_DIR}/") for name in bundle.files)
    if job.kind.runtime:
        bundle.smlaunch = (f"smlaunch's runtime in {PACKAGES_DIR}/ ({shipped} files: {', '.join(packages)}), which "
                           f"{PurePosixPath(cfg.entry_point).name} imports")
    elif loop:
        bundle.smlaunch = (f"smlaunch's restart loop in {PACKAGES_DIR}/ ({shipped} files: {', '.join(packages)}), "
                           "which the image's toolkit runs in place of torchrun (max_restarts)")
    else:
        bundle.smlaunch = "nothing of smlaunch (a user script: what runs it is in the image or on the machine)"
    if loop and job.kind.runtime:
        bundle.smlaunch += f", and its restart loop {RESTART_LOOP_PROGRAM}, which the toolkit runs (max_restarts)"
    return bundle


def uses_restart_loop(cfg) -> bool:
    """A SageMaker job with restart rules or a hang_timeout: its image's toolkit runs smlaunch's restart loop
    (launcher.wire.restart_loop); local and Slurm jobs run the bootstrap, which has it."""
    return cfg.restart_policy.needs_bootstrap and cfg.on_sagemaker


def never_shipped(job) -> list[Path]:
    """What no archive of this job holds, wherever it lies: the job files of its extends chain
    (their environment holds secrets), and smlaunch's state and the job's local outputs
    (launcher.config.code_rules.job_state)."""
    return [*job.files, *job_state(job.config, job.base_dir)]


def program_name(cfg) -> str:
    """`sagemaker_program`: the entry point inside the archive."""
    return cfg.entry_point if cfg.source_dir else PurePosixPath(cfg.entry_point).name
