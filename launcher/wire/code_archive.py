"""Extracting a job's code archive (sourcedir.tar.gz) as strictly as tarfile's "data" filter:
nothing lands outside the code directory, devices and pipes are refused, modes lose setuid,
setgid, sticky and group/other write, and files belong to the extracting user. The bootstrap
extracts the code with it (container/toolkit/code.py), and so does the process runner when it
reads a job's requirements.txt and the files it names (launcher/local/jobenv.py).

Where Python lacks the filter (< 3.10.12 / 3.11.4: Debian 12's 3.11.2) members are extracted one
by one, each checked against what the earlier ones left on disk, so links chained through other
links cannot lead out either.
"""

from __future__ import annotations

import copy
import os
import tarfile
from pathlib import Path


class UnsafeArchive(ValueError):
    """A member would land outside the destination, or is a device, pipe or link leaving it."""

    def __init__(self, archive: Path, dest: Path, name: str):
        super().__init__(f"{archive}: member {name!r} would be written outside {dest}, or is a device, pipe or "
                         "link leaving it; rebuild the code archive from plain files")


def extract(archive: Path, dest: Path) -> None:
    """The archive's members into `dest`; UnsafeArchive naming the first member that may not be."""
    # The "data" filter refuses paths and links leaving dest, devices and pipes; "/a" lands in dest.
    with tarfile.open(archive) as tar:
        if not hasattr(tarfile, "data_filter"):
            _extract_checked(tar, archive, dest)
            return
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            raise UnsafeArchive(archive, dest, exc.tarinfo.name) from None


def _extract_checked(tar: tarfile.TarFile, archive: Path, dest: Path) -> None:
    """As strict as the data filter where Python lacks it: members are extracted one by one, and
    each is checked against the real file system as the earlier members left it, so a path or link
    that leaves dest through links extracted before it (`d -> .`, `b -> d/..`, then `b/x`) is
    refused. A member never replaces a link already there: that would change where the links
    checked before it point."""
    root = Path(dest).resolve()
    root.mkdir(parents=True, exist_ok=True)

    def inside(path: str) -> bool:
        return Path(os.path.realpath(path)).is_relative_to(root)

    # Ownership is the extracting user's, as with the data filter (as root, tarfile would chown).
    owner = {"uid": os.geteuid(), "gid": os.getegid(), "uname": "", "gname": ""}
    # Python >= 3.12 has filters; a test may hide data_filter there: this function then does the checking.
    trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    for member in tar:
        name = member.name.lstrip("/")  # as the data filter: "/a.py" lands in dest
        path = os.path.join(root, name)
        bad = (
            not (member.isfile() or member.isdir() or member.issym() or member.islnk())
            or not inside(path) or os.path.islink(path)
            or (member.issym() and (os.path.isabs(member.linkname)
                                    or not inside(os.path.join(os.path.dirname(path), member.linkname))))
            or (member.islnk() and not _regular_inside(root, member.linkname.lstrip("/")))
        )
        if bad:
            raise UnsafeArchive(archive, dest, member.name)
        clean = copy.copy(member)  # TarInfo.replace is as new as the filters
        clean.name = name
        if member.isfile() or member.isdir():
            clean.mode = member.mode & 0o755  # no setuid, setgid or sticky bit, no group or other write
        if member.islnk():
            clean.linkname = member.linkname.lstrip("/")
        for key, value in owner.items():
            setattr(clean, key, value)
        tar.extract(clean, root, **trusted)


def _regular_inside(root: Path, name: str) -> bool:
    """A hard link's target: a regular file already extracted, reached without leaving root."""
    path = os.path.join(root, name)
    return Path(os.path.realpath(path)).is_relative_to(root) and not os.path.islink(path) and os.path.isfile(path)
