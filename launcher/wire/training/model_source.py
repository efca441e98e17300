"""Where a model comes from: what `hf_pretrained_model_name_or_dir` names (a directory, an input
channel, or a Hub model), and the Hugging Face Hub for such a model.

The same reading on the client (validation) and in the container (loading), as transformers
reads `from_pretrained`'s argument: an existing directory first, then an input channel of the
job, then a Hub id `org/name`, optionally pinned with `@revision` (a branch, tag or commit).

The Hub, for the client and the container alike: a model's config.json (the client validates and
plans from it) and one message per way a Hub model can fail to load. `huggingface_hub` is imported
inside the functions: `smlaunch --help` does not pay for it. It reads HF_TOKEN, HF_HUB_OFFLINE,
HF_HOME and HF_HUB_CACHE itself; a token never enters a message.
"""

from __future__ import annotations

import json
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


# --- the Hugging Face Hub ---------------------------------------------------------------------

class HubError(RuntimeError):
    """A Hub model that cannot be had: what went wrong (naming it) and what to do."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


def token_from(environment: dict[str, str] | None = None) -> str | None:
    """The token the job will use (its `environment`'s HF_TOKEN) or, else, this machine's."""
    return (environment or {}).get("HF_TOKEN") or os.environ.get("HF_TOKEN") or None


def cached_config(repo_id: str, revision: str | None = None) -> dict | None:
    """config.json from this machine's Hugging Face cache, without the network; None if absent."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return json.loads(open(path).read()) if isinstance(path, str) else None


def fetch_config(repo_id: str, revision: str | None = None, token: str | None = None) -> dict:
    """config.json of a Hub model (the cache first; the network unless HF_HUB_OFFLINE=1)."""
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo_id, "config.json", revision=revision, token=token)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear message; see explain()
        raise HubError(*explain(exc, repo_id, revision, token)) from None
    return json.loads(open(path).read())


def explain(exc: BaseException, repo_id: str, revision: str | None, token: str | None) -> tuple[str, str]:
    """(what went wrong fetching `repo_id`, what fixes it), with any token blanked out."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision}" if revision else ""
    name = f"Hugging Face model {repo_id}{at}"
    elsewhere = "or give a directory or an input channel that holds the model"
    if isinstance(exc, GatedRepoError):
        problem = f"{name} is gated"
        fix = (f"accept its license at https://huggingface.co/{repo_id} with your account, then give "
               "the job a token of that account (environment HF_TOKEN)")
    elif isinstance(exc, RepositoryNotFoundError):
        access = "the token given has no access to it" if token else "no HF_TOKEN was given"
        problem = f"{name} was not found on the Hub ({access})"
        fix = "check the id (org/name), or set environment HF_TOKEN if the model is private"
    elif isinstance(exc, RevisionNotFoundError):
        problem, fix = f"{name}: the repository has no such revision", "use a branch, tag or commit hash of it"
    elif isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        offline = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        problem = f"{name} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {offline}"
        fix = f"download it into that cache first (`hf download {repo_id}`), {elsewhere}"
    elif isinstance(exc, HfHubHTTPError):
        problem, fix = f"{name}: the Hub refused the request ({exc})", f"retry, {elsewhere}"
    else:
        problem = f"{name} could not be downloaded ({type(exc).__name__}: {exc})"
        fix = f"check the network, {elsewhere}"
    if token:
        problem, fix = problem.replace(token, "****"), fix.replace(token, "****")
    return problem, fix
