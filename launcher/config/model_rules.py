"""The job's model on the client: read the pretrained source's config.json where this machine can
(a local directory or channel, the Hugging Face cache, the Hub), resolve the model as the runtime
will (model_resolution.py), and check what smlaunch's own train.py needs of it.

A script of the user's own may read the model hyperparameters however it likes: for it these
findings are warnings, and the Hub is not contacted. For smlaunch's train.py they are errors, so
a model that would fail (or silently train something else) is refused before anything is sent.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

# Imports inside functions: huggingface_hub loads only for a model named on the Hub.
from launcher.config.data_rules import channel_issues, tokenizer_issues
from launcher.config.job import JobConfig
from launcher.config.job_rules import code_dir, resolve_path
from launcher.wire.training.hf_config import WEIGHT_FILES, hf_config
from launcher.wire.training.issues import Issue
from launcher.wire.training.model_resolution import ModelResolution, resolve_model, trainable_issues
from launcher.wire.training.model_source import (
    FIELD,
    HubError,
    ModelSource,
    ModelSourceError,
    cached_config,
    fetch_config,
    parse_model_source,
    token_from,
)
from launcher.wire.training.models import preset_for_hf_name

HP = "hyperparameters"


@dataclass
class _Config:
    """What the client learnt of the pretrained source's config.json."""

    config: dict | None = None
    name: str | None = None
    issues: list[Issue] = field(default_factory=list)
    deferred: bool = False  # only the container can read it (an S3 channel)


def job_model(job: JobConfig, base_dir: Path, trainer: bool) -> ModelResolution:
    hp = job.hyperparameters
    found = _Config()
    if hp.hf_pretrained_model_name_or_dir and not hp.model_preset:
        found = _pretrained_config(job, base_dir, trainer)
    resolution = resolve_model(hp, found.config, found.name)
    resolution.issues[:0] = found.issues
    if trainer:
        resolution.issues += _trainer_issues(job, base_dir, resolution, found.deferred)
    else:  # the user's script decides what these hyperparameters mean
        resolution.issues = [replace(i, level="warning") for i in resolution.issues]
    return resolution


def _source(job: JobConfig, base_dir: Path, field: str, value: str, what: str) -> tuple[ModelSource | None,
                                                                                       list[Issue]]:
    """`value` read as the runtime reads it (launcher.wire.training.model_source: a directory relative to
    the code, an input channel, a Hub id): its source, or None and why it names nothing."""
    try:
        source = parse_model_source(value, job.channels(), code_dir(job, base_dir))
    except ModelSourceError as exc:
        return None, [Issue(field, value, str(exc), f"give a directory (relative to source_dir, or absolute), the "
                            f"name of an input channel that holds {what}, or a Hub id such as meta-llama/Llama-3.1-8B")]
    if source.kind == "directory" and job.on_sagemaker and Path(os.path.expanduser(value)).is_absolute():
        return source, [Issue(field, value, "is a directory of this machine, which a SageMaker container sees only "
                              "if its image holds it", "upload it to S3 and name an input channel that holds it",
                              "warning")]
    return source, []


def _tokenizer_issues(job: JobConfig, base_dir: Path) -> list[Issue]:
    """hyperparameters.tokenizer names something the job can load (the runtime refuses it at start
    otherwise); a code directory on S3 is only the container's to look in."""
    value = job.hyperparameters.tokenizer
    if not value or code_dir(job, base_dir) is None:
        return []
    return _source(job, base_dir, f"{HP}.tokenizer", value, "the tokenizer's files")[1]


def _pretrained_config(job: JobConfig, base_dir: Path, trainer: bool) -> _Config:
    value = job.hyperparameters.hf_pretrained_model_name_or_dir
    source, issues = _source(job, base_dir, FIELD, value, "the model")
    if source is None:
        return _Config(issues=issues)
    if source.kind == "hub":
        return _hub_config(job, source, trainer)
    if source.kind == "directory":
        directory = source.path
    else:
        channel = job.channels()[source.channel].s3_data
        if channel.startswith("s3://"):
            return _Config(deferred=True)
        directory = resolve_path(base_dir, channel)
    found = _directory_config(directory, job.hyperparameters.init_from_scratch, value)
    found.issues[:0] = issues
    return found


def _directory_config(directory: Path, from_scratch: bool | None, value: str) -> _Config:
    try:
        config = json.loads((directory / "config.json").read_text())
    except FileNotFoundError:
        return _Config(issues=[Issue(FIELD, value, f"{directory} has no config.json",
                                     "point it at a Hugging Face model directory (save_pretrained's output)")])
    except (OSError, ValueError) as exc:
        return _Config(issues=[Issue(FIELD, value, f"{directory}/config.json cannot be read ({exc})",
                                     "write it again with save_pretrained")])
    issues = []
    if not from_scratch and not any(os.path.isfile(directory / name) for name in WEIGHT_FILES):
        issues.append(Issue(FIELD, value, f"{directory} holds no weights ({', '.join(WEIGHT_FILES)})",
                            "add the weights, or set init_from_scratch: 1 to train this architecture "
                            "from random weights"))
    return _Config(config, value, issues)


def _hub_config(job: JobConfig, source: ModelSource, trainer: bool) -> _Config:
    """The Hub model's config: a known Meta model's published shapes (no import of huggingface_hub,
    which would double `smlaunch validate`'s start-up), else this machine's Hugging Face cache,
    else (for smlaunch's train.py) config.json from the Hub, which also proves the id and token work."""
    preset = preset_for_hf_name(source.repo_id)
    if preset is not None:
        return _Config(hf_config(preset), preset.name)
    try:
        config = cached_config(source.repo_id, source.revision)
    except (OSError, ValueError):
        config = None
    if config is None and trainer:
        try:
            config = fetch_config(source.repo_id, source.revision, token_from(job.environment))
        except HubError as exc:
            return _Config(issues=[Issue(FIELD, source.text, exc.problem, exc.fix)])
    return _Config(config, source.text if config is not None else None)


def _trainer_issues(job: JobConfig, base_dir: Path, resolution: ModelResolution, deferred: bool) -> list[Issue]:
    issues = trainable_issues(job.hyperparameters, resolution, deferred) + _tokenizer_issues(job, base_dir)
    if resolution.spec is None:
        return issues
    return issues + channel_issues(job, base_dir, resolution.spec) + tokenizer_issues(job, base_dir, resolution.spec)
