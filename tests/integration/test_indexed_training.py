"""Training on indexed token shards through train.py: read in order they train exactly as the
JSON Lines blocks of the same corpus, and a corpus megatron-core's own builder wrote of the same
documents as smlaunch's shards; shuffled, a run resumed at a smaller and at a larger world size
continues the uninterrupted run's losses (the same global order); shards of another tokenizer, or a
checkpoint of another shuffle, are refused before training; a checkpoint resumed on shards of
another tokenizer is refused, on appended shards warned of. The in-process half (format, order,
rows): tests/unit/test_indexed.py; what a resume makes of changed data:
tests/unit/test_resume_data.py."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from container.data.indexed import TokenStream
from tests.support.close import order_tolerance
from tests.support.hf_models import llama_config, save_llama, save_tokenizer
from tests.support.megatron import build, smlaunch_documents
from tests.support.pack import DOCS, run, write_docs
from tests.support.train_runs import run_train, series

SEQ = 64
STEPS, SAVED_AT = 6, 3
# fp32, the same 4 x 64 tokens a step in other layouts: sums in another order (train_runs)
REL = order_tolerance(4 * SEQ)
COMMON = {"max_context_width": SEQ, "train_batch_size": 4, "max_steps": STEPS, "lr_decay_iters": STEPS,
          "checkpoint_freq": SAVED_AT}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """DOCS x 8 as byte tokens, packed both ways: (JSON Lines channel, indexed channel)."""
    root = tmp_path_factory.mktemp("corpus")
    docs = write_docs(root / "docs", DOCS * 8)
    assert run("--input", docs, "--output-dir", root / "jsonl", "--block-size", SEQ) == 0
    assert run("--input", docs, "--output-dir", root / "indexed", "--format", "indexed") == 0
    return root / "jsonl" / "train", root / "indexed" / "train"


def train(tmp, nproc, channel, **hp):
    return run_train(tmp, nproc, **{**COMMON, "dataset_type": "indexed", "training_dir": str(channel), **hp})


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory, corpus):
    """The uninterrupted reference: one process, shuffled (the default for indexed shards)."""
    return train(tmp_path_factory.mktemp("shuffled"), 1, corpus[1])


def test_indexed_shards_in_order_train_as_the_json_lines_blocks(tmp_path, corpus, shuffled):
    records = train(tmp_path / "jsonl", 1, corpus[0], dataset_type="jsonl")
    in_order = train(tmp_path / "indexed", 1, corpus[1], shuffle=0)
    for key in ("loss", "grad_norm"):
        assert series(in_order, key) == series(records, key)  # the same batches: the same numbers
    # the control: the shuffled run trains on other rows
    assert series(shuffled, "loss")[0] != series(in_order, "loss")[0]


def test_a_megatron_corpus_trains_as_the_same_documents_in_smlaunchs_shards(tmp_path, corpus, shuffled):
    """The same documents written by megatron-core's own IndexedDatasetBuilder, each cut into
    sequences of up to 50 tokens as preprocess_data.py --split-sentences leaves them (several a
    document), train the shuffled run's very losses: the same rows in the same order with the same
    document masks. The job names the vocabulary the pairs do not record; validate names their format
    (tests/unit/test_megatron_corpus.py). 1 rank, 6 steps: about 3 s."""
    docs = [[doc[i:i + 50] for i in range(0, len(doc), 50)] for doc in smlaunch_documents(TokenStream(corpus[1]))]
    assert sum(len(doc) > 1 for doc in docs) > len(docs) // 2  # most documents are several sequences
    channel = build(tmp_path / "megatron" / "web_text_document", docs, np.uint8)
    records = train(tmp_path / "run", 1, channel, vocab_size=256)
    for key in ("loss", "grad_norm"):
        assert series(records, key) == series(shuffled, key), key


def _resume(tmp_path, saved_at_world: int, resume_world: int, corpus, **layout) -> list[dict]:
    first = tmp_path / "first"
    train(first, saved_at_world, corpus[1], max_steps=SAVED_AT, train_batch_size=4 // saved_at_world)
    second = tmp_path / "second"
    shutil.copytree(first / "checkpoints", second / "checkpoints")
    return train(second, resume_world, corpus[1], train_batch_size=4 // resume_world, **layout)


@pytest.mark.parametrize(("saved_world", "resumed_world"), [(2, 1), (1, 4)], ids=["shrink 2->1", "grow 1->4"])
def test_a_shuffled_run_resumes_the_same_order_at_another_world_size(tmp_path, corpus, shuffled, saved_world,
                                                                     resumed_world):
    records = _resume(tmp_path, saved_world, resumed_world, corpus)
    assert series(records, "step") == list(range(SAVED_AT + 1, STEPS + 1))
    for key in ("loss", "grad_norm"):
        assert series(records, key) == pytest.approx(series(shuffled, key)[SAVED_AT:], rel=REL), key


def test_a_resume_with_another_seed_is_refused(tmp_path, corpus):
    first = tmp_path / "first"
    train(first, 1, corpus[1], max_steps=SAVED_AT)
    shutil.copytree(first / "checkpoints", tmp_path / "second" / "checkpoints")
    with pytest.raises(AssertionError) as failure:
        train(tmp_path / "second", 1, corpus[1], seed=8)
    assert ("data stream (dataset_type, seed, shuffle, data_mixture and truncation_mode) was indexed, shuffled "
            "with seed 7") in str(failure.value)


def test_a_resume_on_other_shards_is_refused_for_another_tokenizer_and_warned_of_for_appended_ones(
        tmp_path, tokenizer_dir):
    """Trained to a checkpoint on the first two of three shards, then resumed on each of: shards of
    the same documents packed with another tokenizer (refused before a step), all three shards
    (appended: a warning, and it trains on), the same two shards (the control: no warning)."""
    docs = write_docs(tmp_path / "docs", DOCS * 8)
    assert run("--input", docs, "--output-dir", tmp_path / "three", "--format", "indexed", "--shard-tokens",
               15_000) == 0
    three = tmp_path / "three" / "train"
    two = tmp_path / "two"
    two.mkdir()
    for name in ("train-00000.bin", "train-00000.idx", "train-00001.bin", "train-00001.idx"):
        shutil.copy(three / name, two / name)
    assert run("--input", docs, "--output-dir", tmp_path / "bpe", "--format", "indexed", "--tokenizer",
               tokenizer_dir) == 0
    hp = {"vocab_size": 320}  # the byte tokens' 256 and the BPE's 300 both fit
    train(tmp_path / "first", 1, two, max_steps=SAVED_AT, **hp)

    def resume(name, channel) -> list[dict]:
        shutil.copytree(tmp_path / "first" / "checkpoints", tmp_path / name / "checkpoints")
        return train(tmp_path / name, 1, channel, **hp)

    def log(name) -> str:
        return (tmp_path / name / "rank-logs" / "rank0.log").read_text()

    with pytest.raises(AssertionError) as refused:
        resume("bpe", tmp_path / "bpe" / "train")
    assert ("channel train was packed with UTF-8 bytes (vocab_size 256) when the checkpoint was saved, and is now "
            f"packed with {tokenizer_dir} (vocab_size 300, vocabulary sha256") in str(refused.value)
    assert not (tmp_path / "bpe" / "out" / "metrics.jsonl").exists()  # before the first step

    assert series(resume("appended", three), "step") == list(range(SAVED_AT + 1, STEPS + 1))
    warned = [line for line in log("appended").splitlines() if "changed since the checkpoint was saved" in line]
    assert len(warned) == 1 and ("channel train changed since the checkpoint was saved: 1 shard(s) added "
                                 "(train-00002.idx): 2 -> 3 shards") in warned[0]
    assert "the shuffle is a permutation of the channel's rows that depends on how many there are" in warned[0]

    assert series(resume("same", two), "step") == list(range(SAVED_AT + 1, STEPS + 1))
    assert "changed since the checkpoint was saved" not in log("same")


def test_shards_of_another_tokenizer_fail_before_training(tmp_path):
    """A pretrained model with its tokenizer.json, and shards packed as UTF-8 bytes: every id is
    inside its vocabulary (320), so only the tokenizer check sees that they mean other tokens."""
    model = tmp_path / "model"
    save_llama(model, llama_config())
    save_tokenizer(model)
    docs = write_docs(tmp_path / "docs", DOCS)
    assert run("--input", docs, "--output-dir", tmp_path / "bytes", "--format", "indexed") == 0
    hp = {"model_preset": "", "hf_pretrained_model_name_or_dir": str(model), "max_steps": 1}
    with pytest.raises(AssertionError) as failure:
        train(tmp_path / "run", 1, tmp_path / "bytes" / "train", **hp)
    assert "channel train was packed with UTF-8 bytes (its UTF-8 bytes), whose ids mean other tokens" in \
        str(failure.value)
    assert not (tmp_path / "run" / "out" / "metrics.jsonl").exists()  # before the first step
    # the control: the same documents packed with the model's tokenizer train
    assert run("--input", docs, "--output-dir", tmp_path / "tok", "--format", "indexed", "--tokenizer", model) == 0
    assert len(series(train(tmp_path / "ok", 1, tmp_path / "tok" / "train", **hp), "loss")) == 1
