"""Batches of documents → token ids: UTF-8 bytes, or a fast `transformers` tokenizer (a local
directory or a Hub id, through the usual HF cache, HF_TOKEN and HF_HUB_OFFLINE)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from container.data.corpus import PackError

Encode = Callable[[list[str]], list[list[int]]]


def byte_encode(texts: list[str]) -> list[list[int]]:
    return [list(text.encode("utf-8")) for text in texts]


def load_tokenizer(name: str):
    """A fast `transformers` tokenizer, or PackError saying why not."""
    from transformers import AutoTokenizer

    path = Path(name).expanduser()
    if name.startswith((".", "/", "~")) and not path.is_dir():  # not a Hub id: do not ask the Hub
        raise PackError(f"--tokenizer {name}: no such directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path) if path.is_dir() else name, use_fast=True)
    except Exception as e:  # noqa: BLE001 - hub, file and format errors of every kind: one line each
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PackError(f"--tokenizer {name}: cannot load it ({reason}); give a directory holding "
                        f"tokenizer.json or a Hub model id (HF_TOKEN for gated models, "
                        f"HF_HUB_OFFLINE=1 to use the local cache only)") from None
    if not tokenizer.is_fast:
        raise PackError(f"--tokenizer {name}: {type(tokenizer).__name__} is not a fast tokenizer; "
                        f"packing needs one backed by the tokenizers library (a tokenizer.json)")
    return tokenizer


def tokenizer_encode(tokenizer, add_special_tokens: bool | None, eos: bool) -> Encode:
    """Batch encoding with `tokenizer` (add_special_tokens None: the tokenizer's default)."""
    options = {"return_attention_mask": False, "return_token_type_ids": False,
               # Whole documents exceed model_max_length before they are cut into blocks; its
               # "sequence length is longer than the maximum" warning would be noise.
               "verbose": False}
    if add_special_tokens is not None:
        options["add_special_tokens"] = add_special_tokens
    eos_id = tokenizer.eos_token_id
    if eos and eos_id is None:
        raise PackError(f"--eos: the tokenizer {tokenizer.name_or_path} has no eos_token; leave out --eos")

    def encode(texts: list[str]) -> list[list[int]]:
        ids = tokenizer(texts, **options)["input_ids"]
        if eos:
            for doc in ids:
                doc.append(eos_id)
        return ids

    return encode
