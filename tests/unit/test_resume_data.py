"""A resume on data that changed since its checkpoint was saved (launcher/wire/training/resume.py, compare, on
the records of launcher/wire/checkpoints.py): another tokenizer is refused, other shards or files
are a warning saying what changed and what it does to the order, the same data says nothing; and
`smlaunch validate` says the same where this machine has the checkpoint and the channels. Through
train.py: tests/integration/test_indexed_training.py; the checkpointer's part: test_checkpoint.py."""

from __future__ import annotations

import shutil

import pytest

from container.data.indexed import write_shards
from launcher.config import ConfigError, validate_job
from launcher.wire import checkpoints
from launcher.wire.checkpoints import MARKER
from launcher.wire.training.resume import IN_ORDER_APPENDED, REPACKED, REPLACED, SHUFFLED_APPENDED, compare

BYTES = {"name": "UTF-8 bytes", "vocabulary_sha256": None}
BPE = {"name": "my-bpe", "vocabulary_sha256": "ab" * 32}
FRESH = ("resume on the data the checkpoint was trained on, or start a new run in an empty checkpoint directory "
         "(checkpoint_dir; on SageMaker another checkpoint_s3_uri, in a local job another checkpoint_local_path)")


def shard(name: str, tokens: int) -> dict:
    return {"name": name, "bytes": 2 * tokens, "documents": tokens // 100, "tokens": tokens}


def indexed(shards: list[dict], tokenizer: dict = BYTES, vocab_size: int = 256, shuffled: bool = True) -> dict:
    return {"dataset_type": "indexed", "shuffled": shuffled,
            "channels": {"train": {"tokenizer": tokenizer, "vocab_size": vocab_size, "shards": shards}}}


def files(dataset_type: str, *sizes: tuple[str, int]) -> dict:
    return {"dataset_type": dataset_type, "shuffled": dataset_type == "chat",
            "channels": {"train": {"files": [{"name": name, "bytes": size} for name, size in sizes]}}}


TWO = [shard("web-00000.idx", 1000), shard("web-00001.idx", 500)]
SAVED = indexed(TWO)


def test_the_same_data_is_neither_refused_nor_warned_of():
    for same in (SAVED, files("jsonl", ("a.jsonl", 10)), files("chat", ("a.jsonl", 10))):
        changes = compare(same, same)
        assert (changes.refusals, changes.warnings) == ([], [])


def test_another_tokenizer_is_refused_naming_the_channel_both_tokenizers_and_the_fix():
    [refusal] = compare(SAVED, indexed(TWO, BPE, 300)).refusals
    assert str(refusal) == (
        "channel train was packed with UTF-8 bytes (vocab_size 256) when the checkpoint was saved, and is now "
        "packed with my-bpe (vocab_size 300, vocabulary sha256 abababababababab...): the same token ids mean other "
        f"tokens, so neither the trained model nor the data position carries over; {FRESH}")
    assert compare(SAVED, indexed(TWO, BPE, 300)).warnings == []
    # another vocabulary of the same size is another tokenizer too; the name is a label only (a moved directory)
    assert compare(indexed(TWO, BPE, 300), indexed(TWO, {**BPE, "vocabulary_sha256": "cd" * 32}, 300)).refusals
    assert compare(indexed(TWO, BPE, 300), indexed(TWO, {**BPE, "name": "/elsewhere/my-bpe"}, 300)).refusals == []


@pytest.mark.parametrize("shuffled,then", [(True, SHUFFLED_APPENDED), (False, IN_ORDER_APPENDED)])
def test_appended_shards_are_a_warning_saying_what_the_order_does(shuffled, then):
    [warning] = compare(indexed(TWO, shuffled=shuffled),
                        indexed([*TWO, shard("web-00002.idx", 700)], shuffled=shuffled)).warnings
    assert warning.problem == ("channel train changed since the checkpoint was saved: 1 shard(s) added "
                               "(web-00002.idx): 2 -> 3 shards, 1,500 -> 2,200 tokens")
    assert warning.then == then


@pytest.mark.parametrize("now,what", [
    ([TWO[0]], "1 shard(s) removed (web-00001.idx): 2 -> 1 shards, 1,500 -> 1,000 tokens"),
    ([TWO[0], shard("web-00001.idx", 400)], "1 shard(s) changed in size (web-00001.idx): 2 -> 2 shards, 1,500 -> "
                                             "1,400 tokens"),
    ([TWO[0], shard("web-00000b.idx", 50), TWO[1]], "1 shard(s) added (web-00000b.idx): 2 -> 3 shards, 1,500 -> "
                                                     "1,550 tokens"),  # read before web-00001: not appended
    ([TWO[1], TWO[0]], "its shards are read in another order: 2 -> 2 shards, 1,500 -> 1,500 tokens"),
])
def test_shards_removed_resized_or_put_between_are_a_warning_that_rows_changed(now, what):
    [warning] = compare(SAVED, indexed(now)).warnings
    assert warning.problem == f"channel train changed since the checkpoint was saved: {what}"
    assert warning.then == REPLACED


def test_json_lines_and_chat_files():
    [appended] = compare(files("jsonl", ("a.jsonl", 10)), files("jsonl", ("a.jsonl", 10), ("b.jsonl", 5))).warnings
    assert (appended.problem, appended.then) == (
        "channel train changed since the checkpoint was saved: 1 file(s) added (b.jsonl): 1 -> 2 files, 10 -> 15 "
        "bytes", IN_ORDER_APPENDED)
    # chat examples are packed into rows from the whole channel: any change repacks them
    [chat] = compare(files("chat", ("a.jsonl", 10)), files("chat", ("a.jsonl", 10), ("b.jsonl", 5))).warnings
    assert chat.then == REPACKED


def test_a_channel_or_format_the_checkpoint_keeps_otherwise_is_not_compared_here():
    """dataset_type and data_mixture are the checkpoint's `keeps`: launcher.wire.training.resume refuses them."""
    assert compare(SAVED, files("jsonl", ("a.jsonl", 10))).warnings == []
    other_channel = {**SAVED, "channels": {"web": SAVED["channels"]["train"]}}
    assert compare(SAVED, indexed([], BPE, 300) | other_channel).refusals == []


def test_the_record_of_channels_on_disk(tmp_path):
    channel = tmp_path / "web"
    write_shards([[1, 2, 3], [4, 5]], channel, "web", vocab_size=256, tokenizer=BYTES, shard_tokens=3)
    write_shards([[6] * 7], channel / "later", "web", vocab_size=256, tokenizer=BYTES)
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "b.jsonl").write_text('{"input_ids": [1]}\n')
    (tmp_path / "jsonl" / "a.jsonl").write_text("")
    assert checkpoints.data_streams("indexed", True, {"web": channel}) == {
        "dataset_type": "indexed", "shuffled": True, "channels": {"web": {
            "tokenizer": BYTES, "vocab_size": 256, "shards": [  # uint16 tokens: 2 bytes each
                {"name": "later/web-00000.idx", "bytes": 14, "documents": 1, "tokens": 7},
                {"name": "web-00000.idx", "bytes": 6, "documents": 1, "tokens": 3},
                {"name": "web-00001.idx", "bytes": 4, "documents": 1, "tokens": 2}]}}}
    assert checkpoints.data_streams("jsonl", False, {"train": tmp_path / "jsonl"})["channels"] == {
        "train": {"files": [{"name": "a.jsonl", "bytes": 0}, {"name": "b.jsonl", "bytes": 19}]}}


# --- smlaunch validate --------------------------------------------------------------------------
def test_validate_compares_a_local_checkpoint_with_the_local_channels(runtime_dir, tmp_path):
    docs = [[i % 200] * 40 for i in range(30)]
    old, more, other = tmp_path / "old", tmp_path / "more", tmp_path / "other"
    write_shards(docs[:20], old, "web", vocab_size=256, tokenizer=BYTES, shard_tokens=400)
    shutil.copytree(old, more)
    write_shards(docs[20:], tmp_path / "next", "web", vocab_size=256, tokenizer=BYTES)
    for suffix in (".bin", ".idx"):  # the next shard of the same stem, as a later pack would name it
        (tmp_path / "next" / f"web-00000{suffix}").rename(more / f"web-00002{suffix}")
    write_shards(docs, other, "web", vocab_size=300, tokenizer=BPE)
    step = tmp_path / "ckpt" / "step-3"
    step.mkdir(parents=True)
    (step / MARKER).write_text("{}")
    checkpoints.write_data_streams(step, checkpoints.data_streams("indexed", True, {"train": old}))

    def validated(channel):
        return validate_job({
            "entry_point": "train.py", "source_dir": str(runtime_dir), "instance_type": "local",
            "instance_count": 1, "checkpoint_local_path": str(tmp_path / "ckpt"), "inputs": {"train": str(channel)},
            "hyperparameters": {"model_preset": "llama3-tiny", "dataset_type": "indexed", "max_context_width": 16,
                                "train_batch_size": 2, "checkpoint_freq": 3, "vocab_size": 320}})

    assert validated(old).warnings == []  # the control: the data it was trained on
    [warning] = validated(more).warnings
    assert (warning.path, warning.value) == ("inputs.train", str(more))
    assert warning.problem == ("channel train changed since the checkpoint was saved: 1 shard(s) added "
                               f"(web-00002.idx): 2 -> 3 shards, 800 -> 1,200 tokens ({step})")
    assert warning.fix == SHUFFLED_APPENDED
    with pytest.raises(ConfigError) as refused:
        validated(other)
    [error] = refused.value.issues
    assert error.path == "inputs.train" and "is now packed with my-bpe (vocab_size 300" in error.problem
