"""Where a job's checkpoints are and which is the newest complete one, read without torch.

A checkpoint is a `step-<N>/` directory; it is complete once rank 0 has written its `.complete`
marker, after every rank's files and manifest part (container/checkpoint/checkpointer.py and
container/checkpoint/manifest.py, which take these names from here). `smlaunch status` names the
newest complete one: in a local or Slurm job's checkpoint directory, or under a SageMaker job's
checkpoint_s3_uri.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Imports inside functions: s3io (and botocore) only where a checkpoint is looked for under an s3://
# prefix, which the client does; every rank's checkpointer imports this module and never does.

DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"  # SageMaker's checkpoint_local_path
MARKER = ".complete"
# what `status` says of a checkpoint found by its marker (`Verified: false`)
UNVERIFIED = "; complete marker, not verified (resume verifies it and falls back to an older one)"
STEP_DIR = re.compile(r"step-(\d+)")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    where: str  # the step-<N> directory: a local path or an s3:// URI
    copy: str | None = None  # where the job copies it when it ends (a local job's checkpoint_s3_uri)

    def to_dict(self) -> dict:
        # Found by its marker alone: only resume verifies its manifest (sizes, sha256, the parts
        # against the DCP metadata), and falls back to an older one when it fails.
        out = {"Step": self.step, "Location": self.where, "Verified": False}
        if self.copy:
            out["CopiedTo"] = self.copy
        return out

    def text(self) -> str:
        return f"step {self.step}, {self.where}" + (f" (copied to {self.copy})" if self.copy else "")


def step_dirs(directory: Path) -> list[int]:
    """The steps of the step-<N> directories in `directory`, oldest first (complete or not)."""
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := STEP_DIR.fullmatch(p.name)))


def complete_steps(directory: Path) -> list[int]:
    """The steps whose directory has its marker, oldest first."""
    return [step for step in step_dirs(directory) if (directory / f"step-{step}" / MARKER).is_file()]


def latest_local(directory: Path, s3_uri: str | None = None) -> Checkpoint | None:
    """The newest step-<N> of `directory` with its marker; `s3_uri`: where the job copies them."""
    complete = complete_steps(directory)
    if not complete:
        return None
    step = complete[-1]
    copy = f"{s3_uri.rstrip('/')}/step-{step}" if s3_uri else None
    return Checkpoint(step, str(directory / f"step-{step}"), copy)


def latest_in_s3(s3_client, uri: str) -> Checkpoint | None:
    """The newest step-<N>/ under the s3:// prefix `uri` whose marker is there (SageMaker syncs
    each host's /opt/ml/checkpoints to that prefix)."""
    from botocore.exceptions import ClientError

    from launcher.wire import s3io

    bucket, prefix = s3io.split(uri)
    prefix = prefix.strip("/")
    base = f"{prefix}/" if prefix else ""
    steps = []
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            if m := STEP_DIR.fullmatch(common["Prefix"][len(base):].rstrip("/")):
                steps.append(int(m.group(1)))
    for step in sorted(steps, reverse=True):
        try:
            s3_client.head_object(Bucket=bucket, Key=f"{base}step-{step}/{MARKER}")
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                continue  # a save that did not finish, or a sync still under way
            raise
        return Checkpoint(step, f"s3://{bucket}/{base}step-{step}")
    return None
