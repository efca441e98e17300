"""What a job starts from: the pretrained model's directory (a path, an input channel, or a Hub
snapshot), the model its config.json describes, and the tokenizer shipped with the result.

Hub models are downloaded once per host, by its local rank 0, while the host's other ranks wait
(on a gloo group with a long timeout: an 8B download outlasts NCCL's default). Only the first
host fetches the weights, because rank 0 alone reads them and broadcasts each tensor; the other
hosts fetch config and tokenizer files. Every failure reaches every rank as the same error, before
any training, naming the model, the reason and the fix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from container.args import channels
from container.checkpoint.collectives import from_rank0
from container.checkpoint.hf_export import weight_files
from launcher.wire.training.hf_config import WEIGHT_FILES
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.model_resolution import resolve_model, trainable_issues
from launcher.wire.training.model_source import (
    FIELD,
    ModelSource,
    ModelSourceError,
    explain,
    parse_model_source,
    token_from,
)
from launcher.wire.training.models import ModelSpec

log = logging.getLogger("smlaunch")

# Files that make up a tokenizer (fast, sentencepiece, tiktoken, BPE vocab), as save_pretrained writes them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "tokenizer.tiktoken", "vocab.json", "merges.txt", "vocab.txt",
                   "chat_template.jinja", "chat_template.json")
# One of these means the directory holds a tokenizer AutoTokenizer can load.
TOKENIZER_MARKERS = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model")
_HUB_CONFIG = ["*.json", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.txt", "*.jinja"]
_HUB_WEIGHTS = (["model*.safetensors"], ["pytorch_model*.bin"])  # the second only if the first finds none
_DOWNLOAD_TIMEOUT = timedelta(hours=4)


class PretrainedError(ValueError):
    """The job names a model or tokenizer that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Located:
    source: ModelSource
    directory: Path
    commit: str | None = None  # the Hub snapshot's commit

    def describe(self) -> str:
        commit = f" (commit {self.commit})" if self.commit else ""
        return f"{self.source.describe()}{commit} in {self.directory}"


@dataclass(frozen=True)
class Sources:
    model: Located | None  # hf_pretrained_model_name_or_dir
    tokenizer: Located | None  # the tokenizer model.tar.gz gets (hyperparameter, else the model's)
    load_weights: bool


def prepare(hp: TrainingHyperparameters, rank: int, local_rank: int, world_size: int) -> Sources:
    """Locate (downloading where needed) the pretrained model and the tokenizer. A collective:
    every rank calls it; each learns the directories of its own host."""
    load_weights = bool(hp.hf_pretrained_model_name_or_dir) and not hp.init_from_scratch
    first_host = rank == local_rank  # torchrun numbers ranks host by host
    result: dict = {}
    if local_rank == 0:
        try:
            model = _locate(hp.hf_pretrained_model_name_or_dir, FIELD, weights=load_weights and first_host)
            tokenizer = _locate(hp.tokenizer, "hyperparameters.tokenizer", weights=False) if hp.tokenizer else None
            result = {"model": model, "tokenizer": tokenizer}
        except PretrainedError as exc:
            result = {"error": str(exc)}
    results = _gather(result, world_size)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise PretrainedError(errors[0])
    mine = results[rank - local_rank]
    model, tokenizer = mine["model"], mine["tokenizer"]
    if tokenizer is None and model is not None and _has_tokenizer(model.directory):
        tokenizer = model
    elif tokenizer is not None and not _has_tokenizer(tokenizer.directory):
        raise PretrainedError(f"hyperparameters.tokenizer = {hp.tokenizer!r}: {tokenizer.directory} holds "
                              f"no tokenizer (none of {', '.join(TOKENIZER_MARKERS)}); name a directory, channel "
                              "or Hub id with tokenizer files (save_pretrained's output)")
    return Sources(model, tokenizer, load_weights)


def _gather(result: dict, world_size: int) -> list[dict]:
    if world_size == 1 or not dist.is_initialized():
        return [result]
    group = dist.new_group(backend="gloo", timeout=_DOWNLOAD_TIMEOUT)
    results: list = [None] * world_size
    dist.all_gather_object(results, result, group=group)
    dist.destroy_process_group(group)
    return results


def _locate(value: str | None, field: str, weights: bool) -> Located | None:
    if not value:
        return None
    found = channels()
    try:
        source = parse_model_source(value, found, Path.cwd())
    except ModelSourceError as exc:
        raise PretrainedError(f"{field} = {value!r}: {exc}") from None
    if source.kind == "directory":
        return Located(source, source.path)
    if source.kind == "channel":
        return Located(source, found[source.channel])
    return _download(source, field, weights)


def _download(source: ModelSource, field: str, weights: bool) -> Located:
    from huggingface_hub import snapshot_download

    token = token_from()
    try:
        kwargs = {"revision": source.revision, "token": token, "ignore_patterns": ["original/*"]}
        path = Path(snapshot_download(source.repo_id, allow_patterns=_HUB_CONFIG, **kwargs))
        for patterns in _HUB_WEIGHTS if weights else ():
            path = Path(snapshot_download(source.repo_id, allow_patterns=_HUB_CONFIG + patterns, **kwargs))
            if any((path / name).is_file() for name in WEIGHT_FILES):
                break
    except Exception as exc:  # noqa: BLE001 - each failure becomes one message: explain
        problem, fix = explain(exc, source.repo_id, source.revision, token)
        raise PretrainedError(f"{field} = {source.text!r}: {problem}; {fix}") from None
    return Located(source, path, commit=path.name)


def model_spec(hp: TrainingHyperparameters, sources: Sources) -> ModelSpec:
    """The model train.py builds, decided as the client decided it (model_resolution.py)."""
    config = name = None
    if sources.model is not None:
        config_file = sources.model.directory / "config.json"
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError) as exc:
            raise PretrainedError(f"{FIELD} = {hp.hf_pretrained_model_name_or_dir!r}: cannot read {config_file} "
                                  f"({exc}); name a Hugging Face model directory (save_pretrained's output)") from None
        name = hp.hf_pretrained_model_name_or_dir
    resolution = resolve_model(hp, config, name)
    issues = resolution.issues + trainable_issues(hp, resolution)
    errors = [str(i) for i in issues if i.level == "error"]
    if errors:
        raise PretrainedError("; ".join(errors))
    for warning in (i for i in issues if i.level == "warning"):
        log.warning("%s", warning)
    return resolution.spec


def base_identity(sources: Sources, rank: int, seed: int) -> dict:
    """What identifies the frozen base a LoRA run trains adapters on, for its checkpoints to record
    (launcher.wire.training.resume): the model's source, its Hub commit, and the sha256 of its weight
    files' bytes, read by rank 0 (on the first host, which holds them) and given to every rank. Random
    weights have no digest: the seed that drew them names them."""
    if not sources.load_weights:
        return {"model": f"random weights (seed {seed})", "revision": None, "weights_sha256": None}
    located = sources.model
    digest = error = None
    if rank == 0:
        try:
            digest = weights_sha256(located.directory)
        except OSError as exc:  # must reach every rank, or the others would wait for the digest for ever
            error = f"{FIELD}: cannot read the weights of {located.describe()} to record them ({exc})"
    digest, error = from_rank0((digest, error))
    if error:
        raise PretrainedError(error)
    return {"model": located.source.describe(), "revision": located.commit, "weights_sha256": digest}


def weights_sha256(directory: Path) -> str:
    """One sha256 over a model directory's weight files (as transformers picks them): each file's name
    and the digest of its bytes (an 8B model's 16 GB in bf16: about 14 s at the 1.2 GB/s of one core here)."""
    digest = hashlib.sha256()
    for path in weight_files(directory):
        with path.open("rb") as f:
            digest.update(path.name.encode() + hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_MARKERS)


def copy_tokenizer(tokenizer: Located, out_dir: Path) -> list[str]:
    """Copy the tokenizer's files next to the exported model; the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        if (tokenizer.directory / name).is_file():
            shutil.copyfile(tokenizer.directory / name, out_dir / name)  # follows the Hub cache's links
            copied.append(name)
    return copied
