"""What the unit and integration tests of secrets share (tests/{unit,integration}/test_secrets.py)."""

from __future__ import annotations

import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path

# Files that hold the job's secrets because the job needs them, as on SageMaker: owner-only.
MUST_HOLD = ("job.json", "spec.json", "hyperparameters.json")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def secrets_in_files(root: Path, secrets: Iterable[str]) -> dict[str, list[str]]:
    """Where under `root` any of `secrets` is: each file (but those that must hold them, MUST_HOLD)
    and each member of a .tar.gz archive among them, with the secrets it holds."""
    secrets = list(secrets)
    found = {}
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file() and p.name not in MUST_HOLD):
        if held := _held(path.read_bytes(), secrets):
            found[str(path)] = held
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                found.update({f"{path}:{m.name}": held for m in tar.getmembers() if m.isfile()
                              if (held := _held(tar.extractfile(m).read(), secrets))})
    return found


def _held(data: bytes, secrets: list[str]) -> list[str]:
    text = data.decode("utf-8", "replace")
    return [s for s in secrets if s in text]
