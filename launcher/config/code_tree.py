"""A code tree (source_dir, a dependency directory, a package) as a code archive holds it: the names
the ignore patterns leave out, credential files, and the rule for symlinks: followed where they stay
inside the tree, refused where they leave it, break or loop, since the container would receive a
dangling link.

launcher.backends.sourcedir packs every tree through `walk`, and validate walks the job's trees
with the same function (launcher.config.code_rules): a tree validate passes is one submit packs,
and one it refuses is refused in the same words.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from launcher.wire.masking import credential_pattern
from launcher.wire.training.issues import SourceDirError

DEFAULT_IGNORE: tuple[str, ...] = (
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".ipynb_checkpoints",
    ".DS_Store",
    ".pytest_cache",
    ".mypy_cache",
    "node_modules",
)

# keep(link or path as found, the file or directory it is, its archive name): False leaves it out,
# and a directory with everything in it
Keep = Callable[[Path, Path, str], bool]


class TreeError(SourceDirError):
    """A code tree the archive cannot hold: `problem` and `fix` apart, for validate's Issue."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}: {fix}")
        self.problem, self.fix = problem, fix


def job_ignore(cfg) -> tuple[str, ...]:
    """The ignore patterns of a job (a JobConfig): the defaults and its source_ignore."""
    return DEFAULT_IGNORE + tuple(cfg.source_ignore)


def ignored_by(name: str, ignore: Sequence[str]) -> str | None:
    """The pattern (fnmatch on one path component's basename) that leaves `name` out, if any."""
    return next((pattern for pattern in ignore if fnmatchcase(name, pattern)), None)


def a_credential(tree_root: Path, path: Path, real: Path, arcname: str) -> bool:
    """Whether the entry is a credential file or directory (launcher.wire.masking.CREDENTIAL_PATTERNS),
    by its name or, for a link, by its target's: `settings.cfg -> .env` is the .env file."""
    target = real.relative_to(tree_root).as_posix() if real != path else arcname
    return bool(credential_pattern(arcname, real.is_dir()) or credential_pattern(target, real.is_dir()))


def walk(root: Path, prefix: str, ignore: Sequence[str], keep: Keep) -> Iterator[tuple[str, Path]]:
    """(archive name, the file or directory it is) of each entry under `root` (names under `prefix`)
    that no ignore pattern leaves out and `keep` keeps, a directory before what it holds; TreeError
    at the first symlink that leaves the tree, is broken or loops."""
    real_root = root.resolve()
    yield from _walk(real_root, real_root, prefix, ignore, keep, frozenset({real_root}))


def _walk(tree_root: Path, directory: Path, prefix: str, ignore: Sequence[str], keep: Keep,
          ancestors: frozenset[Path]) -> Iterator[tuple[str, Path]]:
    for child in directory.iterdir():
        if ignored_by(child.name, ignore):
            continue
        arcname = f"{prefix}/{child.name}" if prefix else child.name
        real = follow_link(child, tree_root) if child.is_symlink() else child
        if not keep(child, real, arcname):
            continue
        if real.is_dir():
            if real in ancestors:
                raise TreeError(f"symlink '{child}' points to its own ancestor '{real}'",
                                "remove the link or add its name to source_ignore")
            yield arcname, real
            yield from _walk(tree_root, real, arcname, ignore, keep, ancestors | {real})
        elif real.is_file():
            yield arcname, real
        # Sockets, FIFOs and device nodes have no meaning in a code archive: left out.


def follow_link(link: Path, tree_root: Path) -> Path:
    """The file or directory `link` names, when it lies inside `tree_root`; TreeError if not."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on Python < 3.13
        raise TreeError(f"symlink '{link}' is broken or loops ({exc})",
                        "fix it, remove it, or add its name to source_ignore") from None
    if not target.is_relative_to(tree_root):
        raise TreeError(f"symlink '{link}' points outside '{tree_root}' (to '{target}'), so the container "
                        "would get a dangling link",
                        "copy the target in, pass it as a dependency, or add the link's name to source_ignore")
    return target


def resolved(path: Path) -> Path:
    """The path with its links resolved; a path that loops, as it is written (nothing in a tree is it)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))
