"""Chat and instruction records -> fine-tuning examples: tokens, and labels that are -100 except on
the tokens the model learns to produce (docs/data.md, "Chat and instruction fine-tuning").

The tokens are the model's own tokenizer's and its chat template's. What is trained is TRL's
definition of the completion, generalised to every assistant turn of a conversation:

- `messages`: for each assistant turn i, the tokens that `apply_chat_template(messages[:i+1])`
  adds after `apply_chat_template(messages[:i], add_generation_prompt=True)`; the input is
  `apply_chat_template(messages)`. System and user turns, and each turn's generation prompt
  (the assistant header), are context, never targets.
- conversational `prompt` + `completion`: `apply_chat_template(prompt + completion)`, trained
  after `apply_chat_template(prompt, add_generation_prompt=True)` (TRL's SFTTrainer).
- plain-text `prompt` + `completion`: the prompt's tokens (with the tokenizer's special tokens,
  its BOS), then the completion's and an EOS (TRL adds one unless the completion ends with it),
  all of those trained after the prompt; no template.

That definition holds only where the template renders a conversation's start the same whatever
follows: every shorter rendering must be a token prefix of the longer ones. A template that does
not (one that drops earlier turns' reasoning, say) would shift the labels onto other tokens, so it
is an error naming the record, never a silent mislabel. So are a tokenizer without a chat
template (for records given as messages), and what launcher.wire.chat_records refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from container.data.rows import IGNORE_INDEX
from launcher.wire.chat_records import CONVERSATIONAL, MESSAGES, TEXT, ChatRecordError, record_shape


class ChatError(ChatRecordError):
    """A chat example or tokenizer that cannot be trained: the message names the record and the fix."""


@dataclass(frozen=True)
class Example:
    """One tokenized example: `labels` is `input_ids` where trained, IGNORE_INDEX elsewhere (the
    targets before the causal shift, as Hugging Face models take `labels`)."""

    input_ids: list[int]
    labels: list[int]
    where: str

    @property
    def trained(self) -> int:
        """Tokens trained on: a label at position 0 has nothing before it to predict it."""
        return sum(1 for label in self.labels[1:] if label != IGNORE_INDEX)


def load_tokenizer(directory: Path, name: str) -> ChatTokenizer:
    """The model's tokenizer, as transformers loads it from `directory` (`name` says where it is
    from, for messages)."""
    # transformers only here: the container's other paths (token channels, synthetic data) run
    # without it, and its import costs seconds.
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ChatError("dataset_type chat tokenizes with transformers' tokenizer and chat template, and "
                        "transformers is not installed in this image: add transformers to source_dir's "
                        "requirements.txt, or use an image that has it") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - any load failure becomes one message naming the tokenizer
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ChatError(f"dataset_type chat: cannot load the tokenizer of {name} ({reason}); name a tokenizer "
                        "directory (save_pretrained's files) with hyperparameter tokenizer") from None
    return ChatTokenizer(tokenizer, name)


class ChatTokenizer:
    """Turns records into Examples with one tokenizer (a transformers tokenizer: its
    apply_chat_template, chat_template, eos_token_id and __call__ are used)."""

    def __init__(self, tokenizer, name: str):
        self.tokenizer, self.name = tokenizer, name

    @property
    def has_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def pad_token_id(self) -> int:
        """What fills a row after its examples (never attended to by them, never a target)."""
        for token in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if token is not None:
                return int(token)
        raise ChatError(f"the tokenizer of {self.name} has neither a pad nor an eos token to fill rows with: "
                        "give a tokenizer that has one")

    def example(self, record: dict, where: str) -> Example:
        shape = record_shape(record, where)
        if shape == TEXT:
            return self._text(record["prompt"], record["completion"], where)
        if not self.has_template:
            raise ChatError(f"{where}: a {shape} example needs a chat template, and the tokenizer of {self.name} "
                            "has none (no chat_template in tokenizer_config.json, no chat_template.jinja): use the "
                            "tokenizer of a chat/instruct model (hyperparameter tokenizer), or give plain-text "
                            "prompt and completion strings")
        if shape == MESSAGES:
            return self._messages(record["messages"], where)
        assert shape == CONVERSATIONAL
        return self._prompt_completion(record["prompt"], record["completion"], where)

    def _render(self, messages: Sequence[dict], where: str, generation_prompt: bool = False) -> list[int]:
        try:
            ids = self.tokenizer.apply_chat_template(
                [{"role": m["role"], "content": m["content"]} for m in messages], tokenize=True,
                add_generation_prompt=generation_prompt, return_dict=False)
        except Exception as exc:  # noqa: BLE001 - the template's own errors (raise_exception) are the record's
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ChatError(f"{where}: the chat template of {self.name} fails on this record ({reason}); "
                            "fix the record (roles in the order the template expects) or leave it out") from None
        return [int(t) for t in ids]

    def _prefix(self, shorter: list[int], longer: list[int], where: str, what: str) -> None:
        if longer[:len(shorter)] == shorter:
            return
        at = next((k for k, (a, b) in enumerate(zip(shorter, longer)) if a != b), min(len(shorter), len(longer)))
        piece = self.tokenizer.decode
        raise ChatError(f"{where}: the chat template of {self.name} renders earlier turns differently once later "
                        f"turns follow: {what}, it differs at token {at} ({piece(shorter[at:at + 8])!r} against "
                        f"{piece(longer[at:at + 8])!r}), so which tokens answer the turn is not defined; use a "
                        "template that renders each turn the same whatever follows it, or give the examples as "
                        "prompt/completion")

    def _messages(self, messages: list[dict], where: str) -> Example:
        full = self._render(messages, where)
        labels = [IGNORE_INDEX] * len(full)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._render(messages[:i], where, generation_prompt=True)
            upto = self._render(messages[:i + 1], where)
            self._prefix(before, upto, where, f"messages[:{i}] with the generation prompt are not the start of "
                                              f"messages[:{i + 1}]")
            self._prefix(upto, full, where, f"messages[:{i + 1}] are not the start of the whole conversation")
            if len(upto) == len(before):
                raise ChatError(f"{where}: messages[{i}]: the chat template of {self.name} renders this assistant "
                                "turn as no tokens: there is nothing to train on")
            labels[len(before):len(upto)] = full[len(before):len(upto)]
        return self._checked(Example(full, labels, where))

    def _prompt_completion(self, prompt: list[dict], completion: list[dict], where: str) -> Example:
        before = self._render(prompt, where, generation_prompt=True)
        full = self._render(prompt + completion, where)
        self._prefix(before, full, where, "the prompt with the generation prompt is not the start of prompt + "
                                          "completion")
        return self._checked(Example(full, [IGNORE_INDEX] * len(before) + full[len(before):], where))

    def _text(self, prompt: str, completion: str, where: str) -> Example:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ChatError(f"{where}: a plain-text completion ends with the EOS token, and the tokenizer of "
                            f"{self.name} has none: give a tokenizer with an eos_token")
        prompt_ids = list(self.tokenizer(prompt)["input_ids"])  # with its special tokens: the BOS a model expects
        completion_ids = list(self.tokenizer(completion, add_special_tokens=False)["input_ids"])
        if not completion_ids or completion_ids[-1] != eos:
            completion_ids.append(int(eos))
        return self._checked(Example(prompt_ids + completion_ids,
                                     [IGNORE_INDEX] * len(prompt_ids) + completion_ids, where))

    def _checked(self, example: Example) -> Example:
        if not example.trained:
            raise ChatError(f"{example.where}: the example has no token to train on after its prompt "
                            f"(tokenizer {self.name}): give a completion or assistant turn")
        return example


def check_vocabulary(example: Example, vocab_size: int, name: str) -> None:
    """Every token id inside the model's vocabulary (the tokenizer may have more tokens)."""
    outside = [t for t in example.input_ids if not 0 <= t < vocab_size]
    if outside:
        raise ChatError(f"{example.where}: the tokenizer of {name} gives token id {outside[0]}, outside the model's "
                        f"vocabulary [0, {vocab_size}): use the model's own tokenizer")
