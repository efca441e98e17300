"""The local files a code directory's requirements.txt makes pip read: the one reading both the
client's check (validate) and the job's environment (its key, launcher.local.jobenv) rely on.

On SageMaker the toolkit runs `pip install -r requirements.txt` in the code's extracted copy
(/opt/ml/code), and smlaunch's runners do the same in theirs: a path inside source_dir is there,
relative to the same root; a path outside it (absolute, or climbing out with `..`) does not exist
there. So what pip reads locally is, for each requirements file (requirements.txt and the `-r`/`-c`
files it names, recursively):

- `-r`/`--requirement`, `-c`/`--constraint`: a file, relative to the file that names it (pip's rule);
- `-f`/`--find-links`: a directory or file, relative to the naming file where that exists, else to the
  code directory (pip's rule); `-i`/`--index-url`, `--extra-index-url` with a `file:` URL;
- `-e`/`--editable` and requirement lines that are paths (a separator or a leading `.`, an archive
  name such as `x.whl`) or `file:` URLs (`pkg @ file:///...`): relative to the code directory, where
  pip runs.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from launcher.wire.training.issues import Issue

REQUIREMENTS = "requirements.txt"
# Options whose value is a path or URL pip reads, by every spelling pip takes.
_FILE_OPTIONS = {"-r": "requirement", "--requirement": "requirement", "-c": "constraint",
                 "--constraint": "constraint"}
_LOCATION_OPTIONS = {"-f": "find-links", "--find-links": "find-links", "-i": "index-url",
                     "--index-url": "index-url", "--extra-index-url": "index-url", "-e": "editable",
                     "--editable": "editable"}
_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar", ".zip")
_COMMENT = re.compile(r"(^|\s+)#.*$")
MAX_FILES = 100  # requirements files followed through -r/-c at most


@dataclass(frozen=True)
class LocalPath:
    """A local path a requirements file makes pip read."""

    where: str  # file:line, the file relative to the code directory
    written: str  # as the line writes it
    path: Path  # resolved
    within: str | None  # the path relative to the code directory, where it lies there
    kind: str = "path"  # how the line names it: editable, path, requirement-url, requirement, find-links, ...

    @property
    def installs(self) -> bool:
        """A package pip installs from here (`-e ./pkg`, `./pkg`, `./x.whl`, `pkg @ file:...`), not a
        file of requirements or a place to look for them."""
        return self.kind in ("editable", "path", "requirement-url")

    @property
    def inside(self) -> bool:
        """Written relative to the code directory and within it: there on every target."""
        return self.within is not None and not Path(os.path.expandvars(_path_part(self.written))).is_absolute()

    def problem(self) -> str:
        """Why pip cannot read this path where the job runs (for a path that is not `inside`)."""
        why = ("pip runs in the job's copy of source_dir (as the SageMaker toolkit does, in /opt/ml/code), "
               "where only source_dir's files exist, relative to it")
        if self.within is not None:
            return f"{self.where}: {self.written!r} is an absolute path; {why}"
        return f"{self.where}: {self.written!r} is outside source_dir; {why}"

    def fix(self) -> str:
        if self.within is not None:
            return f"write it relative to source_dir: ./{self.within}"
        return ("copy it into source_dir and name it relative to it (e.g. ./wheels/, -e ./pkg), or install it "
                "from a package index")


def local_paths(code_dir: Path) -> list[LocalPath]:
    """Every local path requirements.txt in `code_dir` (and the -r/-c files it names) makes pip read;
    none without a requirements.txt."""
    root = code_dir.resolve()
    found: list[LocalPath] = []
    queue, seen = [root / REQUIREMENTS], set()
    while queue and len(seen) < MAX_FILES:
        file = queue.pop(0)
        if file in seen or not file.is_file():
            continue
        seen.add(file)
        for line_no, line in _logical_lines(file.read_text(encoding="utf-8", errors="replace")):
            for kind, value in _locations(line):
                local = _resolve(kind, value, file.parent, root)
                if local is None:
                    continue
                name = file.relative_to(root).as_posix()
                within = local.relative_to(root).as_posix() if local.is_relative_to(root) else None
                found.append(LocalPath(f"{name}:{line_no}", value, local, within, kind))
                if kind in ("requirement", "constraint") and within is not None:
                    queue.append(local)
    return found


def content_digest(paths: list[LocalPath], code_dir: Path) -> list[tuple[str, bytes]]:
    """(path relative to the code directory, sha256) of every file of the paths inside it, each
    once, in order: what an environment built from them depends on (`-e .` or `.`: all of it)."""
    root = code_dir.resolve()
    digests: dict[str, bytes] = {}
    for local in paths:
        if not local.inside or not local.path.exists():
            continue
        files = [local.path] if local.path.is_file() else sorted(p for p in local.path.rglob("*") if p.is_file())
        for file in files:
            digests[file.relative_to(root).as_posix()] = hashlib.sha256(file.read_bytes()).digest()
    return sorted(digests.items())


def check_requirement_paths(ctx) -> list[Issue]:
    """Every path requirements.txt names that the job's code does not hold: an error (context.Context)."""
    if not ctx.job.source_dir or ctx.code_dir is None or not (ctx.code_dir / REQUIREMENTS).is_file():
        return []
    return [Issue("source_dir", ctx.job.source_dir, local.problem(), local.fix())
            for local in local_paths(ctx.code_dir) if not local.inside]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line, as pip joins them: comments stripped,
    backslash continuations joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.sub("", raw)
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _locations(line: str) -> list[tuple[str, str]]:
    """(kind, value) of the paths or URLs a logical line names: options' values, or the line's
    requirement when it is a path or a URL."""
    tokens = line.split()
    if not tokens[0].startswith("-"):
        requirement = line.split(";", 1)[0].split(" --", 1)[0].strip()
        if "@" in requirement and not _looks_like_path(requirement):
            return [("requirement-url", requirement.split("@", 1)[1].strip())]
        return [("path", requirement)] if _looks_like_path(requirement) else []
    out = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        option, eq, value = token.partition("=")
        short = re.fullmatch(r"(-[rcfie])(.+)", token)
        if short:  # -rfile, -f./wheels
            option, value, eq = short.group(1), short.group(2), "="
        kind = _FILE_OPTIONS.get(option) or _LOCATION_OPTIONS.get(option)
        if kind and not eq and i + 1 < len(tokens):
            value = tokens[i + 1]
            i += 1
        if kind and value:
            out.append((kind, value.strip("'\"")))
        i += 1
    return out


def _looks_like_path(text: str) -> bool:
    """pip's test for a requirement that is a path: a separator, a leading dot, an archive name,
    or a file: URL."""
    text = text.strip("'\"")
    if text.startswith("file:"):
        return True
    if "://" in text:
        return False
    return "/" in text or os.sep in text or text.startswith(".") or text.lower().endswith(_ARCHIVES)


def _path_part(value: str) -> str:
    """A path requirement without its extras (`./pkg[extra]`) or quotes; a file: URL's path."""
    value = re.sub(r"\[[^\]]*\]$", "", value.strip("'\""))
    if value.startswith("file://"):
        return unquote(urlparse(value).path)
    return value.removeprefix("file:")


def _resolve(kind: str, value: str, file_dir: Path, root: Path) -> Path | None:
    """The local path `value` names (None: a remote URL, a distribution name, an index on the network)."""
    value = os.path.expandvars(value)
    if value.startswith("file:"):
        path = Path(_path_part(value))
    elif "://" in value or re.match(r"^[a-z][a-z0-9+.-]*\+", value):  # https://, git+ssh://
        return None
    elif kind in ("index-url", "requirement-url"):
        return None
    elif kind == "editable" and not _looks_like_path(value):
        return None  # -e with a VCS URL
    else:
        path = Path(_path_part(value))
    if path.is_absolute():
        return Path(os.path.normpath(path))
    if kind in ("requirement", "constraint"):
        base = file_dir
    elif kind == "find-links" and (file_dir / path).exists():
        base = file_dir
    else:
        base = root
    return Path(os.path.normpath(base / path))
