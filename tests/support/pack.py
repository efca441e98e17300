"""What the unit and integration tests of pack share (tests/{unit,integration}/test_pack.py)."""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import pytest

from container.data.packing import main

BLOCK = 16


WORDS = ["the", "llama", "sat", "on", "a", "mat", "while", "16 384", "tokens", "of", "context", "—", "ü",
         "日本語", "🦙", "flowed", "past\n"]


_rng = random.Random(0)


# 40 documents of 0 to 60 words: an empty one, and most far longer than model_max_length (8).
DOCS = [" ".join(_rng.choice(WORDS) for _ in range(_rng.randint(0, 60))) for _ in range(40)]


SUMMARY = re.compile(r"wrote (\d+) blocks of (\d+) tokens \((.*)\) from (\d+) documents, (\d+) tokens; "
                     r"(\d+) tokens left over \((.*)\); vocab_size (\d+)")


def _save_tokenizer(path: Path, eos: bool = True) -> Path:
    """A real byte-level BPE (vocab 300) whose post-processor starts every text with <s>, as
    Llama 3's starts it with <|begin_of_text|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(DOCS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    special = {"bos_token": "<s>", "eos_token": "</s>"} if eos else {"bos_token": "<s>"}
    PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=8, **special).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return _save_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def reference(tokenizer_dir: Path, texts, block_size: int = BLOCK, *, add_special_tokens: bool = True,
              eos: bool = False) -> tuple[list[list[int]], int]:
    """(blocks, tokens): one text at a time through AutoTokenizer, concatenated, cut (group_texts)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids: list[int] = []
    for text in texts:
        ids += tok(text, add_special_tokens=add_special_tokens)["input_ids"]
        ids += [tok.eos_token_id] if eos else []
    whole = len(ids) // block_size * block_size
    return [ids[i:i + block_size] for i in range(0, whole, block_size)], len(ids)


def run(*argv) -> int:
    """main() in-process; argparse's own errors exit, which is the same exit code."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def written_records(path: Path) -> list[dict]:
    with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as f:
        return [json.loads(line) for line in f]


def blocks(path: Path) -> list[list[int]]:
    """The blocks of a written file, checking each record is the seed's layout (with the
    position_ids `pack` writes by default: 0 where a document or the block starts, else + 1)."""
    written = written_records(path)
    for r in written:
        assert list(r) in (["input_ids", "attention_mask", "labels"],
                           ["input_ids", "attention_mask", "labels", "position_ids"])
        assert r["labels"] == r["input_ids"] and r["attention_mask"] == [1] * len(r["input_ids"])
        positions = r.get("position_ids", [0])
        assert positions[0] == 0 and all(q in (0, p + 1) for p, q in zip(positions, positions[1:]))
    return [r["input_ids"] for r in written]


def summary(stdout: str) -> dict:
    m = SUMMARY.search(stdout)
    assert m, stdout
    keys = ["blocks", "block_size", "where", "documents", "tokens", "left_over", "why", "vocab_size"]
    return {k: (v if k in ("where", "why") else int(v)) for k, v in zip(keys, m.groups())}


def write_docs(directory: Path, texts) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (directory / f"{i:03d}.txt").write_text(text)
    return directory
