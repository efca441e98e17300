"""SageMaker's output archives (model.tar.gz, output.tar.gz): the hosts' directories merged into one
tar.gz, written whole or not at all. Local jobs pack on this machine (launcher.local.artifacts),
a Kubernetes pod on S3 storage in the container (container.toolkit.pod_storage)."""

from __future__ import annotations

import contextlib
import os
import tarfile
from pathlib import Path


def files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if not p.is_dir()] if directory.is_dir() else []


def pack(directories: list[Path], dest: Path) -> Path:
    """SageMaker's merge of the hosts' directories into one archive: a file that several hosts
    wrote at the same path is taken from the first host (rank 0's host) that has it."""
    seen: set[str] = set()
    with whole(dest) as partial, tarfile.open(partial, "w:gz") as tar:
        for directory in directories:
            for path in sorted(files(directory)):
                name = path.relative_to(directory).as_posix()
                if name in seen:
                    continue
                seen.add(name)
                tar.add(path, arcname=name, recursive=False)
    return dest


@contextlib.contextmanager
def whole(dest: Path):
    """A temporary name next to `dest`, renamed to `dest` only once written completely; removed
    if writing fails (a full disk), so no truncated artifact is ever left under its real name."""
    partial = dest.with_name(f".{dest.name}.partial")
    try:
        yield partial
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
