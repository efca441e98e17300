"""What `hf_pretrained_model_name_or_dir` names: a directory, an input channel, or a Hub model.

The same reading on the client (validation) and in the container (loading), as transformers
reads `from_pretrained`'s argument: an existing directory first, then an input channel of the
job, then a Hub id `org/name`, optionally pinned with `@revision` (a branch, tag or commit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?")
FIELD = "hyperparameters.hf_pretrained_model_name_or_dir"


class ModelSourceError(ValueError):
    """The value names nothing loadable; the message says what it is not and what to write."""


@dataclass(frozen=True)
class ModelSource:
    text: str  # as the user wrote it
    kind: Literal["directory", "channel", "hub"]
    path: Path | None = None  # directory: where it is (relative paths as given)
    channel: str | None = None
    repo_id: str | None = None
    revision: str | None = None  # None: the Hub's default branch

    def describe(self) -> str:
        if self.kind == "hub":
            return f"Hub model {self.repo_id}" + (f" at revision {self.revision}" if self.revision else "")
        if self.kind == "channel":
            return f"input channel {self.channel!r}"
        return f"directory {self.path}"


def parse_model_source(value: str, channels: Iterable[str] = (), base_dir: Path | None = None) -> ModelSource:
    """Classify `value`. `base_dir`: where a relative directory is looked for (the script's
    working directory in the container; source_dir on the client)."""
    path = Path(os.path.expanduser(value))  # an unknown ~user stays as written
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if os.path.isdir(path):  # False, not an exception, for a path too long to be one
        return ModelSource(value, "directory", path=path)
    if value in set(channels):
        return ModelSource(value, "channel", channel=value)
    match = HUB_ID.fullmatch(value)
    looks_like_path = value.startswith(("/", ".", "~")) or value.count("/") > 1
    if match and not looks_like_path:
        return ModelSource(value, "hub", repo_id=match["repo"], revision=match["revision"])
    channel_list = ", ".join(sorted(channels)) or "none"
    raise ModelSourceError(
        f"{value!r} is not a directory ({path} does not exist), not an input channel of the job "
        f"(channels: {channel_list}) and not a Hugging Face Hub id (org/name[@revision])")
