"""What smlaunch's train.py will read, checked on the client where it can be seen: the order
settings (shuffle, data_mixture: launcher.wire.training.data_order) against the data's format and the
job's channels, and the channels on this machine (local paths) against the run: a JSON Lines
channel's block length, an indexed channel's shards (complete, of the model's vocabulary, at
least one row), a chat channel's every record (its shape and roles, and a chat template in the
model's tokenizer where the records need one and the tokenizer is a local directory). S3
channels are the container's to check, before training; the SageMaker backend reads which format
an indexed S3 channel holds before it submits (`indexed_s3_channels`), for the tokenizer a
Megatron-Core corpus needs named.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from launcher.config.job import JobConfig
from launcher.config.job_rules import code_dir, resolve_path
from launcher.config.megatron_rules import megatron_issues, vocabulary_given
from launcher.wire.chat_records import (
    TEXT,
    ChatRecordError,
    chat_files,
    has_chat_template,
    read_records,
    record_shape,
)
from launcher.wire.datafiles import (
    TRAIN_CHANNELS,
    VALIDATION_CHANNELS,
    first_block_length,
    first_record,
    refused_field,
)
from launcher.wire.megatron_index import NO_TOKENIZER, MegatronHeader
from launcher.wire.token_shards import (
    ShardError,
    read_header,
    shard_indexes,
    tokenizer_identity,
    tokenizer_json_vocabulary,
    unindexed_tokens,
)
from launcher.wire.training import data_order
from launcher.wire.training.issues import Issue
from launcher.wire.training.model_source import ModelSourceError, parse_model_source
from launcher.wire.training.models import ModelSpec
from launcher.wire.training.run_settings import DEFAULT_DATASET_TYPE, DEFAULT_SEQ_LEN

HP = "hyperparameters"
_INDEXED_FIX = "pack the data with python -m container.data pack --format indexed and set dataset_type: indexed"


def check_data_order(ctx) -> list[Issue]:
    """shuffle and data_mixture against dataset_type and the job's channels (context.Context)."""
    job, hp = ctx.job, ctx.job.hyperparameters
    if not ctx.runtime:
        return []
    dataset_type = hp.dataset_type or DEFAULT_DATASET_TYPE
    issues = []
    if hp.shuffle and dataset_type not in data_order.SHUFFLED:
        issues.append(Issue(f"{HP}.shuffle", hp.shuffle,
                            f"{dataset_type} data is read in order (a JSON Lines channel is a stream; synthetic "
                            "samples are random already)", f"{_INDEXED_FIX}, or drop shuffle"))
    if dataset_type == data_order.CHAT and not (hp.tokenizer or hp.hf_pretrained_model_name_or_dir):
        issues.append(Issue(f"{HP}.dataset_type", dataset_type,
                            "dataset_type chat needs the model's tokenizer (its chat template) to tokenize the "
                            "examples, and the job names none",
                            "set hf_pretrained_model_name_or_dir or tokenizer"))
    if hp.truncation_mode and dataset_type != data_order.CHAT:
        issues.append(Issue(f"{HP}.truncation_mode", hp.truncation_mode,
                            f"cuts chat examples longer than a row, and dataset_type is {dataset_type}",
                            "set dataset_type: chat, or drop truncation_mode"))
    if problems := data_order.mixture_issues(hp):
        return [*issues, *problems]
    mixture = data_order.parse_mixture(hp.data_mixture)
    if mixture and dataset_type != data_order.INDEXED:
        issues.append(Issue(f"{HP}.data_mixture", hp.data_mixture,
                            f"mixes indexed token shards, and dataset_type is {dataset_type}", _INDEXED_FIX))
    channels = job.channels()
    missing = [name for name, _ in mixture if name not in channels]
    if mixture and channels and missing:
        issues.append(Issue(f"{HP}.data_mixture", hp.data_mixture,
                            f"names channel(s) {', '.join(missing)}, which the job's inputs do not have "
                            f"(it has {', '.join(sorted(channels))})",
                            "add them to inputs, or mix the channels it has"))
    return issues


def _read_channels(job: JobConfig) -> list[str]:
    """The channels train.py reads: the train channel (an indexed job's data_mixture's channels),
    the validation channel, those the job has."""
    hp, channels = job.hyperparameters, job.channels()
    names = [next((n for n in group if n in channels), None) for group in (TRAIN_CHANNELS, VALIDATION_CHANNELS)]
    if (hp.dataset_type or DEFAULT_DATASET_TYPE) == data_order.INDEXED:
        try:
            names[0:1] = [name for name, _ in data_order.parse_mixture(hp.data_mixture)] or names[0:1]
        except data_order.MixtureError:
            pass  # check_data_order reports it
    return [name for name in names if name in channels]


def indexed_s3_channels(job: JobConfig) -> list[tuple[str, str]]:
    """(name, s3:// URI) of the indexed channels an indexed job reads from S3 (which validate does not
    see: the SageMaker backend peeks at them before it submits)."""
    if (job.hyperparameters.dataset_type or DEFAULT_DATASET_TYPE) != data_order.INDEXED:
        return []
    channels = job.channels()
    return [(name, channels[name].s3_data) for name in _read_channels(job)
            if channels[name].s3_data.startswith("s3://") and channels[name].s3_data_type == "S3Prefix"]


def channel_issues(job: JobConfig, base_dir: Path, spec: ModelSpec) -> list[Issue]:
    """The job's local channels against the run (see the module docstring)."""
    hp, channels = job.hyperparameters, job.channels()
    dataset_type = hp.dataset_type or DEFAULT_DATASET_TYPE
    seq = hp.max_context_width or DEFAULT_SEQ_LEN
    issues = []
    model_vocabulary = _local_tokenizer(job, base_dir) if dataset_type == data_order.INDEXED else None
    for name in _read_channels(job):
        if channels[name].s3_data.startswith("s3://"):
            continue
        path = resolve_path(base_dir, channels[name].s3_data)
        if dataset_type == data_order.INDEXED:
            issues += _indexed_issues(name, path, seq, spec, model_vocabulary, job)
        elif dataset_type == data_order.CHAT:
            issues += _chat_issues(job, name, path, base_dir)
        elif dataset_type == "jsonl":
            issues += _block_issues(name, path, seq, bool(hp.max_context_width))
    return issues


def _block_issues(name: str, path: Path, seq: int, seq_given: bool) -> list[Issue]:
    """The first record's fields (the job refuses some by name: chat records, per-token weights)
    and length against max_context_width (the runtime would stop at either after the instances
    started); a channel of indexed shards read as JSON Lines."""
    if shard_indexes(path) and not first_block_length(path):
        return [Issue(f"{HP}.dataset_type", "jsonl", f"channel {name!r} holds indexed token shards ({path})",
                      "set dataset_type: indexed")]
    first = first_record(path)
    refused = refused_field(first[1], first[0]) if first and isinstance(first[1], dict) else None
    if refused:
        return [Issue(f"inputs.{name}", str(path), *refused)]
    found = first_block_length(path)
    if found is None or found[1] == seq:
        return []
    file, length = found
    default = "" if seq_given else " (the default)"
    return [Issue(f"{HP}.max_context_width", seq,
                  f"is {seq}{default}, but channel {name!r} holds blocks of {length} tokens ({file})",
                  f"set max_context_width: {length}, or re-pack the data with --block-size {seq}")]


def _chat_issues(job: JobConfig, name: str, path: Path, base_dir: Path) -> list[Issue]:
    """Every record of a chat channel: a fine-tuning example (launcher.wire.chat_records, the
    check the job applies to each record); and where some are given as messages, a chat template
    in the model's tokenizer, when that is a local directory (transformers is not imported here:
    the template is looked for in the files)."""
    field = f"inputs.{name}"
    fix = "make every record one fine-tuning example (docs/data.md, \"Chat and instruction fine-tuning\")"
    try:
        files = [f for f in chat_files(path) if _readable_here(f)]
    except FileNotFoundError:
        return []  # the path rules report a missing channel
    failures, records, templated = [], 0, None
    try:
        for where, record in read_records(files):
            records += 1
            try:
                shape = record_shape(record, where)
            except ChatRecordError as exc:
                failures.append(exc)
                continue
            if shape != TEXT and templated is None:
                templated = (shape, where)
    except ChatRecordError as exc:  # a line that is not JSON: the file's later records are not read
        failures.append(exc)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        return [Issue(field, str(path), f"cannot be read ({exc})", "give UTF-8 JSON Lines (gzipped or not) or "
                                                                    "Parquet files")]
    if failures:
        more = f" ({len(failures):,} of its {records:,} records fail; the first is shown)" if len(failures) > 1 else ""
        return [Issue(field, str(path), f"{failures[0]}{more}", fix)]
    directory = _local_tokenizer_dir(job, base_dir)
    if templated is None or directory is None or has_chat_template(directory) is not False:
        return []
    shape, where = templated
    return [Issue(field, str(path),
                  f"holds {shape} examples ({where}), which the chat template renders, and the tokenizer in "
                  f"{directory} has none (no chat_template in tokenizer_config.json, no chat_template.jinja)",
                  "use the tokenizer of a chat/instruct model (hyperparameters.tokenizer), or give plain-text prompt "
                  "and completion strings")]


def _readable_here(file: Path) -> bool:
    """Parquet files need pyarrow, which the job may have where this machine does not: those are
    then the job's to check."""
    return not file.name.endswith(".parquet") or importlib.util.find_spec("pyarrow") is not None


def _named_dir(job: JobConfig, base_dir: Path, value: str) -> Path | None:
    """The directory a tokenizer or model value names on this machine, read as the runtime reads it
    (relative to the code: launcher.wire.training.model_source); None for a channel, a Hub id or nothing
    (model_rules names a value that is nothing)."""
    code = code_dir(job, base_dir)
    if code is None and not Path(value).expanduser().is_absolute():
        return None  # relative to code on S3: the container's to read
    try:
        source = parse_model_source(value, job.channels(), code)
    except ModelSourceError:
        return None
    return source.path if source.kind == "directory" else None


def _tokenizer_value(job: JobConfig) -> tuple[str, str] | None:
    """(the hyperparameter the job's tokenizer comes from, its value): `tokenizer`, else the
    pretrained model's."""
    hp = job.hyperparameters
    key = next((k for k in ("tokenizer", "hf_pretrained_model_name_or_dir") if getattr(hp, k)), None)
    return (key, getattr(hp, key)) if key else None


def _local_tokenizer_dir(job: JobConfig, base_dir: Path) -> Path | None:
    """The directory of the tokenizer the job tokenizes with, where it is on this machine."""
    named = _tokenizer_value(job)
    directory = _named_dir(job, base_dir, named[1]) if named else None
    return directory if directory is not None and (directory / "tokenizer_config.json").is_file() else None


def tokenizer_issues(job: JobConfig, base_dir: Path, spec: ModelSpec) -> list[Issue]:
    """The job's tokenizer (`tokenizer`, else the pretrained model's), where it is a local
    directory with a tokenizer.json, against the model's vocabulary: an id it gives that the model
    has no row for fails the job at that token (chat examples), or ships a tokenizer the exported
    model cannot take."""
    named = _tokenizer_value(job)
    directory = _named_dir(job, base_dir, named[1]) if named else None
    if directory is None:
        return []
    key, value = named
    tokenizer_json = directory / "tokenizer.json"
    try:
        ids = tokenizer_json_vocabulary(tokenizer_json).values() if tokenizer_json.is_file() else ()
        size = max(map(int, ids), default=-1) + 1  # the ids it can give: its vocabulary and added tokens
    except (OSError, ValueError, TypeError, AttributeError, KeyError, IndexError):
        return []  # not a tokenizer.json this machine can read: the job loads it with transformers, and says
    if size <= spec.vocab_size:
        return []
    return [Issue(f"{HP}.{key}", value,
                  f"its tokenizer ({tokenizer_json}) has {size:,} tokens (its vocabulary and added tokens: ids 0 to "
                  f"{size - 1:,}), more than {spec.name}'s vocabulary of {spec.vocab_size:,}: the job fails at the "
                  "first token past it",
                  f"use the model's own tokenizer, or a model whose vocabulary holds it (vocab_size: {size} or more)")]


def _local_tokenizer(job: JobConfig, base_dir: Path) -> dict | None:
    """The model's tokenizer where this machine has it (`tokenizer`, else the pretrained model, as a
    local directory with a tokenizer.json): its identity, as a shard header records one."""
    named = _tokenizer_value(job)
    directory = _named_dir(job, base_dir, named[1]) if named else None
    if directory is None or not (directory / "tokenizer.json").is_file():
        return None
    return tokenizer_identity(named[1], directory / "tokenizer.json")


def given_tokenizer(job: JobConfig, base_dir: Path) -> dict | None:
    """The tokenizer's identity a checkpoint records of a Megatron corpus, as the job will record it
    (container.run_data); None where the tokenizer is not on this machine (not compared here)."""
    if _tokenizer_value(job) is None:
        return NO_TOKENIZER
    return _local_tokenizer(job, base_dir)


def _indexed_issues(name: str, path: Path, seq: int, spec: ModelSpec, model: dict | None,
                    job: JobConfig) -> list[Issue]:
    """Every shard's header and sizes; its token ids against the model's vocabulary, its tokenizer
    against the model's (where this machine has it); one row at least."""
    field = f"inputs.{name}"
    issues = [_shard_issue(field, error) for error in unindexed_tokens(path)]
    indexes = shard_indexes(path)
    if not indexes:
        return issues or [Issue(field, str(path), "holds no indexed token shards (*.idx and *.bin), and dataset_type "
                                                  "is indexed", "pack them with --format indexed, or set dataset_type: "
                                                  "jsonl")]
    tokens, megatron = 0, False
    for idx in indexes:
        try:
            header = read_header(idx)
        except ShardError as exc:
            issues.append(_shard_issue(field, exc))
            continue
        tokens += header.tokens
        if isinstance(header, MegatronHeader):
            megatron = True
            issues += megatron_issues(field, header, spec)
            continue
        packed = header.tokenizer.get("vocabulary_sha256")
        if model is not None and packed != model["vocabulary_sha256"]:
            issues.append(Issue(field, str(idx), f"{idx.name} was packed with {header.tokenizer.get('name')}, whose "
                                                 f"ids mean other tokens than the model's tokenizer ({model['name']})",
                                "pack the data with the model's tokenizer (pack --tokenizer <the model>)"))
        if header.max_token_id >= spec.vocab_size:
            issues.append(Issue(field, str(idx), f"{idx.name} holds token id {header.max_token_id}, outside "
                                                 f"{spec.name}'s vocabulary of {spec.vocab_size} (packed with "
                                                 f"{header.tokenizer.get('name')})",
                                "pack the data with the model's tokenizer"))
    if megatron:
        issues += vocabulary_given(field, job)
    if not [i for i in issues if i.level == "error"] and tokens < seq:
        issues.append(Issue(field, str(path), f"holds {tokens:,} tokens, fewer than one row of "
                                              f"max_context_width={seq}", "give it more data or a shorter row"))
    return issues


def _shard_issue(field: str, error: ShardError) -> Issue:
    return Issue(field, str(error.path), f"{error.path.name}: {error.problem}", error.fix)
