"""Chat and instruction records (`dataset_type: chat`, docs/data.md), as the client's validation
and the training container both read them: the files of a channel, their records, each record's
shape, and whether a tokenizer directory holds a chat template. Torch- and transformers-free
(`smlaunch validate` imports it); the tokenizing is container.data.chat's.

A record is one fine-tuning example, in one of TRL's dataset shapes:

- `{"messages": [{"role": ..., "content": ...}, ...]}`: a conversation; every assistant turn
  is trained on;
- `{"prompt": [messages], "completion": [messages]}`: conversational prompt-completion; the
  completion is trained on;
- `{"prompt": "text", "completion": "text"}`: standard prompt-completion, plain text (no chat
  template); the completion and an EOS are trained on.

Every other field is metadata, except those in REFUSED_FIELDS: they would change how the example
trains, and are not read, so they are an error naming the field and the fix, never skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from launcher.wire.datafiles import DATA_SUFFIXES, data_files, json_lines

CHAT_SUFFIXES = (*DATA_SUFFIXES, ".parquet")
ROLES = ("system", "user", "assistant")
MESSAGE_FIELDS = ("role", "content")
# The record shapes (record_shape's answers).
MESSAGES = "messages"
CONVERSATIONAL = "prompt-completion (messages)"
TEXT = "prompt-completion (text)"

_TOKENS = ("token fields are read from dataset_type jsonl channels, where the record is already tokenized: "
           "drop the field, or give the tokenized rows as a jsonl channel")
_MARKED = ("the chat template decides which tokens train (the assistant turns, the completion): drop the field")
REFUSED_FIELDS = {
    "conversations": "ShareGPT's conversations (from/value turns) are not read: give them as messages, "
                     'each {"role": "system"|"user"|"assistant", "content": "..."}',
    **dict.fromkeys(("input_ids", "labels", "attention_mask", "position_ids"), _TOKENS),
    **dict.fromkeys(("completion_mask", "assistant_masks", "loss_mask", "loss_weight", "loss_weights", "weight",
                     "weights", "sample_weight"), _MARKED),
    **dict.fromkeys(("tools", "chat_template_kwargs", "images", "image", "documents"),
                    "the chat template is applied to the messages alone, without tools, documents, images or "
                    "template arguments: drop the field, or leave such records out"),
}
# Roles chat datasets use that are not trained here: their turns carry fields (tool calls, tool
# call ids) that this reader does not pass to the template.
OTHER_ROLES = ("tool", "developer", "function", "ipython")


class ChatRecordError(ValueError):
    """A record that cannot be a fine-tuning example: the message names it (file:line) and the fix."""


def chat_files(path: str | Path | Sequence[str | Path]) -> list[Path]:
    """A chat channel's files (JSON Lines and Parquet, any depth), in sorted name order."""
    return data_files(path, CHAT_SUFFIXES)


def read_records(files: Sequence[Path]) -> Iterator[tuple[str, object]]:
    """(where, record) of every record of `files` in order: JSON Lines by line (`file:line`),
    Parquet by row (`file row i`, from 0; a null column is an absent field, as Parquet writes a
    field some records lack)."""
    for path in files:
        if path.name.endswith(".parquet"):
            yield from _parquet_records(path)
            continue
        yield from json_lines(path, lambda where, what: ChatRecordError(
            f"{where}: not JSON ({what}); a chat channel's .jsonl/.json files hold one JSON object per line "
            "(JSON Lines), not one JSON array"))


def _parquet_records(path: Path) -> Iterator[tuple[str, object]]:
    try:
        import pyarrow.parquet as pq  # only for Parquet files: `smlaunch validate` imports this module
    except ImportError:
        raise ChatRecordError(f"{path}: reading Parquet needs pyarrow, which is not installed: pip install "
                              "pyarrow (in a job: add it to source_dir's requirements.txt), or give JSON "
                              "Lines") from None
    import pyarrow as pa

    row = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                yield f"{path} row {row}", _without_nulls(record)
                row += 1
    except (pa.ArrowException, OSError) as exc:  # a damaged or truncated file, or not Parquet at all
        raise ChatRecordError(f"{path}: not a readable Parquet file ({exc}); write it again, or give JSON "
                              "Lines") from None


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def record_shape(record: object, where: str) -> str:
    """MESSAGES, CONVERSATIONAL or TEXT; ChatRecordError naming the record when it is none of them
    or its turns cannot be trained (no assistant turn, an unknown role, content not a string)."""
    if not isinstance(record, dict):
        raise ChatRecordError(f"{where}: expected a JSON object with messages, or prompt and completion; "
                              f"found {type(record).__name__}")
    for name in record:
        if name in REFUSED_FIELDS:
            raise ChatRecordError(f"{where}: field {name!r} changes how the example trains and is not read: "
                                  f"{REFUSED_FIELDS[name]}")
    if "messages" in record:
        if "prompt" in record or "completion" in record:
            raise ChatRecordError(f"{where}: has messages and prompt/completion; give one of the two shapes")
        _check_messages(record["messages"], f"{where}: messages", first_may_answer=False)
        return MESSAGES
    if "prompt" in record or "completion" in record:
        missing = "completion" if "prompt" in record else "prompt"
        if missing not in record:
            raise ChatRecordError(f"{where}: has {'prompt' if missing == 'completion' else 'completion'} but no "
                                  f"{missing}; a prompt-completion example gives both")
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            if not completion:
                raise ChatRecordError(f"{where}: completion is empty: there is nothing to train on")
            return TEXT
        if isinstance(prompt, list) and isinstance(completion, list):
            _check_messages(prompt, f"{where}: prompt", need_assistant=False)
            _check_messages(completion, f"{where}: completion", first_may_answer=True)
            return CONVERSATIONAL
        raise ChatRecordError(f"{where}: prompt is {type(prompt).__name__} and completion "
                              f"{type(completion).__name__}: give both as strings (plain text) or both as "
                              "lists of messages")
    fields = ", ".join(map(repr, record)) or "none"
    raise ChatRecordError(f"{where}: neither messages nor prompt/completion (this record's fields: {fields}); "
                          'give {"messages": [{"role": ..., "content": ...}, ...]} or '
                          '{"prompt": ..., "completion": ...}')


def _check_messages(messages: object, where: str, need_assistant: bool = True, first_may_answer: bool = True) -> None:
    if not isinstance(messages, list) or not messages:
        raise ChatRecordError(f"{where} must be a non-empty list of messages, each {{\"role\": ..., \"content\": "
                              f"...}}; found {json.dumps(messages)[:80]}")
    for i, message in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ChatRecordError(f"{at} is {json.dumps(message)[:80]}: a message is an object with role and "
                                  "content")
        role, content = message["role"], message["content"]
        if role in OTHER_ROLES:
            raise ChatRecordError(f"{at}.role is {role!r}: turns of role {role} are not supported (their fields, "
                                  f"tool calls and ids, are not passed to the template); roles are "
                                  f"{', '.join(ROLES)}: leave such records out")
        if role not in ROLES:
            raise ChatRecordError(f"{at}.role is {json.dumps(role)[:40]}, an unknown role; roles are "
                                  f"{', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ChatRecordError(f"{at}.content is {type(content).__name__}, not a string: give the turn's text "
                                  "as one string (content parts, images and tool calls are not read)")
        other = [name for name in message if name not in MESSAGE_FIELDS]
        if other:
            raise ChatRecordError(f"{at} has field(s) {', '.join(map(repr, other))}, which are not read: a message "
                                  "is role and content only; drop them")
    if need_assistant and not any(m["role"] == "assistant" for m in messages):
        raise ChatRecordError(f"{where} has no assistant turn: there is nothing to train on")
    if not first_may_answer and messages[0]["role"] == "assistant":
        raise ChatRecordError(f"{where}[0] is an assistant turn: it answers nothing (the conversation before it "
                              "is empty); start with a system or user turn")


def has_chat_template(directory: Path) -> bool | None:
    """Whether a tokenizer directory (save_pretrained's files) holds a chat template: in
    chat_template.jinja or chat_template.json, or tokenizer_config.json's chat_template. None
    where the directory holds no tokenizer_config.json to say."""
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return bool(json.loads(config.read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return None
