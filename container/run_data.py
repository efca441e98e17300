"""What the training loop knows of its data before it starts: the tokenizer checks, the record of
the channels a checkpoint's position indexes, the chat tokenizer, and the job log's description
of what is read and how documents are masked."""

from __future__ import annotations

import logging

from container.args import Directories
from container.checkpoint import pretrained
from container.data import loader as data
from container.data.chat import ChatTokenizer, load_tokenizer
from container.data.chat_source import ChatSource
from container.data.indexed_source import IndexedSource
from container.distributed.runtime import Runtime
from container.models import attention
from launcher.wire import checkpoints
from launcher.wire.megatron_index import FORMAT as MEGATRON_FORMAT
from launcher.wire.token_shards import ShardError, tokenizer_identity
from launcher.wire.training.models import ATTENTION_KERNEL_DESCRIPTIONS
from launcher.wire.training.run_settings import RunSettings

log = logging.getLogger("smlaunch")


def check_tokenizer(source, sources: pretrained.Sources, vocab_size_given: bool) -> None:
    """Indexed shards record the tokenizer they were packed with: it must be the model's (where
    the job has the model's tokenizer.json), or every id means another token. A Megatron-Core
    corpus records none: the job must name its tokenizer, or at least vocab_size (as validate says)."""
    if isinstance(source, IndexedSource) and sources.tokenizer is None and not vocab_size_given:
        megatron = next((c for c, s in zip(source.channels, source.streams) if s.is_megatron), None)
        if megatron is not None:
            raise ShardError(source.streams[source.channels.index(megatron)].header.idx,
                             f"channel {megatron.name} holds a {MEGATRON_FORMAT} corpus, which records neither the "
                             "tokenizer it was made with nor its vocabulary size",
                             "set the hyperparameter tokenizer (or hf_pretrained_model_name_or_dir) to the tokenizer "
                             "the corpus was made with, or at least vocab_size")
    if isinstance(source, IndexedSource) and sources.tokenizer is not None:
        located = sources.tokenizer
        source.given_tokenizer = tokenizer_identity(located.source.describe(), located.directory / "tokenizer.json")
        source.check_tokenizer(source.given_tokenizer)


def stream_record(source, s: RunSettings, dirs: Directories) -> dict | None:
    """What each checkpoint records of the data its position indexes (launcher.wire.checkpoints):
    the channels the loader reads; None for synthetic data, made from the seed the checkpoint keeps."""
    if isinstance(source, IndexedSource):
        return checkpoints.data_streams(s.dataset_type, s.shuffle, {c.name: c.path for c in source.channels},
                                        tokenizer=source.given_tokenizer)
    if isinstance(source, (data.JsonlSource, ChatSource)):
        return checkpoints.data_streams(s.dataset_type, s.shuffle, {"train": dirs.train})
    return None


def chat_tokenizer(s: RunSettings, sources: pretrained.Sources) -> ChatTokenizer | None:
    """The tokenizer chat examples are tokenized with (the `tokenizer` hyperparameter's, else the
    pretrained model's); None for other data."""
    if s.dataset_type != "chat":
        return None
    if sources.tokenizer is None:
        raise pretrained.PretrainedError("dataset_type chat needs the model's tokenizer: set "
                                         "hf_pretrained_model_name_or_dir or tokenizer")
    return load_tokenizer(sources.tokenizer.directory, sources.tokenizer.source.describe())


def describe_data(rt: Runtime, source, s: RunSettings) -> None:
    """Once, in the job log: what is read, whether documents are masked, the record fields left unread."""
    if not rt.is_main or not isinstance(source, (data.JsonlSource, IndexedSource, ChatSource)):
        return
    if isinstance(source, (IndexedSource, ChatSource)):
        log.info("data: %s", source.describe())
    if isinstance(source, ChatSource):  # fine-tuning is counted in epochs: say what max_steps makes
        log.info("data: %s", source.epochs(s.max_steps, s.micro_batch * s.grad_accum * rt.dp_size))
    if isinstance(source, ChatSource) and (source.counts.truncated or source.counts.dropped_long
                                           or source.counts.dropped_untrained):
        log.warning("data: %d chat example(s) longer than max_context_width=%d were truncated, %d dropped "
                    "(truncation_mode %s)", source.counts.truncated, s.seq_len,
                    source.counts.dropped_long + source.counts.dropped_untrained, source.truncation_mode)
    if source.marks_documents:
        kernel = attention.kernel().name
        marks = {IndexedSource: "the index marks documents", ChatSource: "every chat example is a document"}
        log.info("data: %s; document masking %s", marks.get(type(source), "records mark documents (position_ids)"),
                 f"on: attention stays within each document ({kernel} kernel: "
                 f"{ATTENTION_KERNEL_DESCRIPTIONS[kernel]}), "
                 "positions restart" if s.document_masking else
                 "off (document_masking=0): packed documents see each other")
    else:
        log.info("data: records mark no documents (no position_ids): each row is one sequence")
    if source.ignored_fields:
        log.info("data: fields not used in training (metadata): %s",
                 ", ".join(f"{name} (first in {where})" for name, where in source.ignored_fields.items()))
