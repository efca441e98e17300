"""`git_config`: the code comes from a git repository, cloned before anything is validated.

As the SageMaker SDK v2's `sagemaker.git_utils.git_clone_repo`: clone `repo` (https with a token
or user name and password put into the URL, or ssh with the machine's keys, never prompting),
check out `branch`, then `commit`; `source_dir`, `entry_point` and `dependencies` are then paths
inside the checkout. The clone is validated like any source_dir (the entry point decides the job
kind), packed into sourcedir.tar.gz and nothing of the repository reaches the request. Unlike
the SDK, `file://` URLs and local paths are accepted too (a mirror on this machine).

A failed clone or checkout is one error naming the repository with its credentials blanked, the
branch or commit, git's own message and the fix.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from launcher.config.aws_settings import GitConfig
from launcher.wire.training.issues import ConfigError, Issue

_CLONES: dict[tuple, Path] = {}  # one clone per repository and revision, for this process
_TIMEOUT_S = 600


def checkout(config: GitConfig) -> Path:
    """The working tree of `config`'s repository at its branch/commit."""
    key = (config.repo, config.branch, config.commit, config.token, config.username, config.password)
    if key not in _CLONES:
        dest = Path(tempfile.mkdtemp(prefix="smlaunch-git-"))
        atexit.register(shutil.rmtree, dest, True)
        _git(config, ["clone", "--quiet", _authenticated_url(config), str(dest)], None, "git_config.repo")
        if config.branch:
            _git(config, ["checkout", "--quiet", config.branch], dest, "git_config.branch")
        if config.commit:
            _git(config, ["checkout", "--quiet", config.commit], dest, "git_config.commit")
        _CLONES[key] = dest
    return _CLONES[key]


def apply(raw: dict) -> dict:
    """A job's raw settings with source_dir/entry_point/dependencies inside the checkout."""
    config = GitConfig.model_validate(raw["git_config"])
    root = checkout(config)
    out = dict(raw)
    if raw.get("source_dir"):
        source = root / raw["source_dir"]
        if not source.is_dir():
            raise ConfigError([Issue("source_dir", raw["source_dir"], f"is not a directory of {_safe(config.repo)}",
                                     "give source_dir relative to the repository's root")])
        out["source_dir"] = str(source)
    else:  # the entry point alone is packed, as the SDK does
        out["entry_point"] = str(root / raw["entry_point"])
    out["dependencies"] = [str(root / d) for d in raw.get("dependencies") or []]
    return out


def _git(config: GitConfig, args: list[str], cwd: Path | None, field: str) -> None:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": "ssh -oBatchMode=yes"}
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise ConfigError([Issue("git_config", _safe(config.repo), "needs the git command, which is not installed",
                                 "install git, or clone the repository yourself and use source_dir")]) from None
    except subprocess.TimeoutExpired:
        raise ConfigError([Issue(field, _safe(config.repo), f"git {args[0]} took over {_TIMEOUT_S} s",
                                 "check the network and the URL")]) from None
    if proc.returncode != 0:
        message = " ".join(_scrub(config, proc.stderr).split())[-400:]
        value = getattr(config, field.split(".")[-1])
        raise ConfigError([Issue(field, _safe(value) if field.endswith("repo") else value,
                                 f"git {args[0]} failed: {message}", _fix(field))])


def _fix(field: str) -> str:
    if field.endswith("repo"):
        return ("check the URL and your access: token (or username and password) for https, "
                "an ssh key for git@ / ssh:// URLs")
    return f"name a {field.split('.')[-1]} that exists in the repository"


def _authenticated_url(config: GitConfig) -> str:
    parts = urlsplit(config.repo)
    if parts.scheme not in ("https", "http") or "@" in parts.netloc:
        return config.repo
    if config.token:
        userinfo = quote(config.token, safe="")
    elif config.username and config.password and not config.two_factor:
        userinfo = f"{quote(config.username, safe='')}:{quote(config.password, safe='')}"
    else:
        return config.repo
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


def _safe(url: str) -> str:
    """The URL without credentials, for messages."""
    parts = urlsplit(url)
    if "@" in parts.netloc and parts.scheme in ("https", "http"):
        return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))
    return url


def _scrub(config: GitConfig, text: str) -> str:
    for secret in (config.token, config.password, _authenticated_url(config)):
        if secret:
            text = text.replace(secret, "***")
    return text
