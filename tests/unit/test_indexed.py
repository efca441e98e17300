"""Indexed token shards (container.data.indexed, launcher.wire.token_shards): what is written is
read back token for token; rows are the JSON Lines format's blocks of the same corpus (the
reference: `pack --format jsonl` read by the JSON Lines loader); damaged shards are errors that
name the file; the seeded order (container.data.order) is a permutation in every epoch, a
mixture keeps its proportions, and neither depends on the world size or on where reading starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from container.data.indexed import TokenStream, write_shards
from container.data.indexed_source import Channel, IndexedSource
from container.data.loader import build_dataloader, build_validation_loader
from container.data.order import Mixture, Permutation
from launcher.wire.token_shards import (
    ShardError,
    encode_header,
    read_header,
    tokenizer_identity,
    tokenizer_json_vocabulary,
    vocabulary_sha256,
)
from tests.support.pack import DOCS, run, write_docs

BYTES = {"name": "UTF-8 bytes", "vocabulary_sha256": None}


def random_documents(count: int, seed: int = 0, longest: int = 70, vocab: int = 256) -> list[list[int]]:
    g = np.random.default_rng(seed)
    return [g.integers(0, vocab, g.integers(0, longest)).tolist() for _ in range(count)]


def shards(tmp_path: Path, documents, shard_tokens: int = 1 << 30, vocab_size: int = 256, name="train") -> Path:
    directory = tmp_path / name
    write_shards(documents, directory, name, vocab_size=vocab_size, tokenizer=BYTES, shard_tokens=shard_tokens)
    return directory


def reference_row(documents, index: int, seq: int) -> tuple[list[int], list[bool]]:
    """Row `index` of the documents back to back, by hand: its tokens, and where documents start
    in it (its first token, and every document's first token inside it)."""
    tokens, starts = [], []
    for doc in documents:
        tokens += doc
        starts += [True] + [False] * (len(doc) - 1) if doc else []
    row = slice(index * seq, (index + 1) * seq)
    return tokens[row], [True] + starts[row][1:]


# --- the format -------------------------------------------------------------------------------

def test_shards_read_back_token_for_token_across_shard_boundaries(tmp_path):
    docs = random_documents(60) + [list(range(200))] + random_documents(20, seed=1)  # one longer than a shard
    directory = shards(tmp_path, docs, shard_tokens=150)
    indexes = sorted(directory.glob("*.idx"))
    assert len(indexes) > 3 and [p.name for p in indexes][:2] == ["train-00000.idx", "train-00001.idx"]
    assert not list(directory.glob(".*"))  # no temporaries left
    stream = TokenStream(directory)
    assert stream.tokens == sum(map(len, docs))
    headers = [read_header(p) for p in indexes]
    assert sum(h.documents for h in headers) == len(docs)
    assert all(h.tokens <= 150 or h.documents == 1 for h in headers)  # documents never split
    assert headers[0].dtype == "uint16" and headers[0].vocab_size == 256
    for seq in (1, 7, 64):
        for index in range(0, stream.rows(seq), max(1, stream.rows(seq) // 25)):
            tokens, starts = stream.row(index, seq)
            want_tokens, want_starts = reference_row(docs, index, seq)
            assert tokens.tolist() == want_tokens and starts.tolist() == want_starts, (seq, index)


def test_uint32_for_vocabularies_past_65536(tmp_path):
    docs = [[0, 70_000, 128_255], [5]]
    stream = TokenStream(shards(tmp_path, docs, vocab_size=128_256))
    assert stream.header.dtype == "uint32" and stream.max_token_id == 128_255
    assert stream.row(0, 4)[0].tolist() == [0, 70_000, 128_255, 5]


def test_a_token_outside_the_writers_vocabulary_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"token id 256 outside the vocabulary \[0, 256\)"):
        shards(tmp_path, [[1, 2], [256]])
    assert not list((tmp_path / "train").glob("*"))  # the failed write left nothing


def _damage(directory: Path, how: str) -> Path:
    idx = directory / "train-00000.idx"
    data = bytearray(idx.read_bytes())
    if how == "magic":
        data[:8] = b"MMIDIDX\x00"
    elif how == "version":
        data[8] = 9
    elif how == "short index":
        data = data[:-8]
    elif how == "offsets":
        data[-16:-8] = (10**6).to_bytes(8, "little")
    if how == "short tokens":
        bin_ = idx.with_suffix(".bin")
        bin_.write_bytes(bin_.read_bytes()[:-2])
    elif how == "no tokens":
        idx.with_suffix(".bin").unlink()
    else:
        idx.write_bytes(bytes(data))
    return idx


@pytest.mark.parametrize(("how", "message"), [
    ("magic", "not an indexed token shard"),
    ("version", "index version 9; this smlaunch reads version 1"),
    ("short index", "truncated or mismatched"),
    ("short tokens", "truncated or mismatched"),
    ("no tokens", "missing: the tokens of train-00000.idx"),
    ("offsets", "the document offsets do not run from 0 to the shard's tokens in order"),
])
def test_a_damaged_shard_is_an_error_naming_its_file(tmp_path, how, message):
    directory = shards(tmp_path, random_documents(10))
    TokenStream(directory)  # the control: whole, it reads
    _damage(directory, how)
    with pytest.raises(ShardError, match=message) as failure:
        TokenStream(directory)
    assert failure.value.path.name.startswith("train-00000.") and failure.value.fix


def rewrite_header(idx: Path, **fields) -> None:
    """The shard's header with `fields` changed (as a hand edit or another tool would), its
    offsets kept, or dropped where documents says -1 (so the index's size agrees with it)."""
    header = read_header(idx)
    offsets = idx.read_bytes()[header.offsets_at:]
    changed = {**header.fields, **fields}
    idx.write_bytes(encode_header(changed) + (b"" if changed["documents"] == -1 else offsets))


@pytest.mark.parametrize(("field", "value"), [
    ("tokens", "12893"), ("documents", "3"), ("max_token_id", "5"), ("tokenizer", "bytes"), ("documents", -1),
    ("vocab_size", True), ("dtype", 2), ("max_token_id", 256), ("vocab_size", 70_000),
    ("tokenizer", {"name": "bytes", "vocabulary_sha256": 7}), ("lengths", {"buckets": [[99, 1, 1, 1]]}),
])
def test_a_header_field_of_the_wrong_type_or_range_is_an_error_naming_the_file_and_field(tmp_path, field, value):
    directory = shards(tmp_path, [[1, 2, 3]] * 10)
    rewrite_header(directory / "train-00000.idx", documents=10)  # the control: rewritten unchanged, it reads
    assert TokenStream(directory).rows(3) == 10
    rewrite_header(directory / "train-00000.idx", **{field: value})
    with pytest.raises(ShardError, match=f"the index header's field '{field}' is ") as failure:
        TokenStream(directory)
    assert failure.value.path.name == "train-00000.idx"
    assert "python -m container.data pack --format indexed" in failure.value.fix


def test_tokens_without_their_index_are_an_error_naming_them(tmp_path):
    directory = shards(tmp_path, random_documents(40), shard_tokens=300)
    whole = TokenStream(directory).tokens  # the control: every shard with its index
    (directory / "train-00001.idx").unlink()
    with pytest.raises(ShardError, match="no index: train-00001.idx is missing beside it") as failure:
        TokenStream(directory)
    assert failure.value.path.name == "train-00001.bin" and whole > 600


# --- rows as the loader gives them ------------------------------------------------------------

def test_rows_equal_the_json_lines_blocks_of_the_same_corpus(tmp_path, capsys):
    """The same text files packed both ways: the indexed channel read in order gives the JSON
    Lines channel's batches (tokens, labels, RoPE positions, document numbers), masking on and off."""
    docs = write_docs(tmp_path / "docs", DOCS)
    assert run("--input", docs, "--output-dir", tmp_path / "jsonl", "--block-size", 32) == 0
    assert run("--input", docs, "--output-dir", tmp_path / "indexed", "--format", "indexed") == 0
    rows = sum(1 for _ in (tmp_path / "jsonl" / "train" / "train.jsonl").open())
    for masking in (True, False):
        records = build_validation_loader(dataset_type="jsonl", path=tmp_path / "jsonl" / "train", seq_len=32,
                                          micro_batch_size=3, dp_rank=0, dp_size=1, vocab_size=256,
                                          document_masking=masking)
        indexed = build_validation_loader(dataset_type="indexed", path=tmp_path / "indexed" / "train", seq_len=32,
                                          micro_batch_size=3, dp_rank=0, dp_size=1, vocab_size=256,
                                          document_masking=masking)
        pairs = list(zip(records, indexed, strict=True))
        assert len(pairs) == rows // 3
        for want, got in pairs:
            assert set(got) == set(want) == ({"input_ids", "labels", "positions", "documents"} if masking
                                             else {"input_ids", "labels"})
            for key in want:
                assert torch.equal(got[key], want[key]), key


def test_a_model_of_a_smaller_vocabulary_is_refused_before_reading(tmp_path):
    directory = shards(tmp_path, [[1, 2, 3], [200, 4]])
    with pytest.raises(ShardError, match=r"token id 200 outside the model's vocabulary \[0, 128\)"):
        IndexedSource([Channel("train", directory)], 2, 128, seed=0, shuffle=False)
    IndexedSource([Channel("train", directory)], 2, 256, seed=0, shuffle=False)  # the control


def test_a_token_the_header_does_not_know_is_caught_when_its_row_is_read(tmp_path):
    directory = shards(tmp_path, [[1, 2, 3, 4], [5, 6, 7, 8]])
    bin_ = directory / "train-00000.bin"
    data = bytearray(bin_.read_bytes())
    data[12:14] = (300).to_bytes(2, "little")  # token 6: a damaged .bin, its header unchanged
    bin_.write_bytes(bytes(data))
    source = IndexedSource([Channel("train", directory)], 4, 256, seed=0, shuffle=False)
    source.read(0, 1)
    with pytest.raises(ShardError, match=r"row 1 of channel train holds token id 300 outside the vocabulary"):
        source.read(1, 1)


def test_fewer_tokens_than_a_row_is_an_error(tmp_path):
    with pytest.raises(ShardError, match="holds 5 tokens, fewer than one row of max_context_width=8"):
        IndexedSource([Channel("train", shards(tmp_path, [[1, 2, 3, 4, 5]]))], 8, 256, seed=0, shuffle=False)


# --- the tokenizer --------------------------------------------------------------------------------

def test_a_tokenizer_is_known_by_its_vocabulary(tmp_path, tokenizer_dir):
    """The digest pack records (transformers' get_vocab()) is the one a job computes from the
    model's tokenizer.json without transformers, and another vocabulary's differs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert tokenizer_json_vocabulary(tokenizer_dir / "tokenizer.json") == tokenizer.get_vocab()
    ours = tokenizer_identity("tok", tokenizer_dir / "tokenizer.json")
    assert ours["vocabulary_sha256"] == vocabulary_sha256(tokenizer.get_vocab())
    other = dict(tokenizer.get_vocab())
    other["<extra>"] = len(other)
    assert vocabulary_sha256(other) != ours["vocabulary_sha256"]


def test_shards_of_another_tokenizer_are_refused(tmp_path, tokenizer_dir):
    model = tokenizer_identity("the model", tokenizer_dir / "tokenizer.json")
    bytes_channel = IndexedSource([Channel("train", shards(tmp_path, [[1, 2, 3]]))], 2, 300, seed=0, shuffle=False)
    with pytest.raises(ShardError, match=r"packed with UTF-8 bytes \(its UTF-8 bytes\), whose ids mean other tokens"):
        bytes_channel.check_tokenizer(model)
    write_shards([[1, 2, 3]], tmp_path / "same", "train", vocab_size=300, tokenizer=model)
    IndexedSource([Channel("train", tmp_path / "same")], 2, 300, seed=0, shuffle=False).check_tokenizer(model)
    bytes_channel.check_tokenizer({"name": "a preset", "vocabulary_sha256": None})  # nothing to compare with


# --- the order --------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 1000, 65_539])
def test_a_permutation_is_a_bijection_and_a_shuffle(n):
    perm = Permutation(n, seed=5)
    order = perm(np.arange(n))
    assert sorted(order.tolist()) == list(range(n))
    if n >= 100:
        assert (order == np.arange(n)).mean() < 0.05  # the control: the identity would be 1
        assert Permutation(n, seed=6)(np.arange(n)).tolist() != order.tolist()
        assert Permutation(n, seed=5, epoch=1)(np.arange(n)).tolist() != order.tolist()
        # neighbours land far apart: a shuffle, not a rotation
        assert np.abs(np.diff(order)).mean() > n / 10


def test_a_permutation_maps_any_index_alone_as_in_a_batch():
    perm = Permutation(10_007, seed=3, epoch=2)
    batch = perm(np.arange(10_007))
    for i in (0, 1, 5000, 10_006):
        assert int(Permutation(10_007, seed=3, epoch=2)([i])[0]) == batch[i]
    with pytest.raises(IndexError):
        perm([10_007])


def test_a_mixture_keeps_its_proportions_and_each_sets_order():
    mixture = Mixture([0.7, 0.2, 0.1])
    data_sets, ks = mixture.locate(np.arange(5000))
    assert np.bincount(data_sets[:1000]).tolist() == [700, 200, 100]  # exact in every round
    for d in range(3):  # each set is read in its own order, sample after sample, no gaps
        assert ks[data_sets == d].tolist() == list(range(int((data_sets == d).sum())))
    g = np.array([123_456_789_012])
    d, k = mixture.locate(g)  # far into training: from g alone
    rounds, slot = divmod(int(g[0]), 1000)
    assert k[0] == rounds * mixture.slots[d[0]] + int((mixture.layout[:slot] == d[0]).sum())
    with pytest.raises(ValueError, match="less than 1/1000"):
        Mixture([1.0, 0.0001])
    with pytest.raises(ValueError, match="positive"):
        Mixture([1.0, 0.0])


def test_weights_near_the_float_maximum_mix_as_small_ones_do():
    """1e308 + 1e308 overflows a float: the shares must come out of the weights' ratios."""
    control = Mixture([1.0, 1.0])
    huge = Mixture([1e308, 1e308])
    data_sets, ks = huge.locate(np.arange(5000))
    assert np.bincount(data_sets).tolist() == [2500, 2500]
    for d in range(2):  # every sample a new row of its set
        assert ks[data_sets == d].tolist() == list(range(2500))
    assert huge.layout.tolist() == control.layout.tolist()
    assert Mixture([3e307, 1e308]).slots.tolist() == Mixture([0.3, 1.0]).slots.tolist() == [231, 769]


def test_every_row_once_an_epoch_in_a_new_order_each_epoch(tmp_path):
    directory = shards(tmp_path, random_documents(120, seed=2))
    source = IndexedSource([Channel("train", directory)], 8, 256, seed=11, shuffle=True)
    n = source.rows[0]
    epochs = [[source._row_of(0, e * n + i) for i in range(n)] for e in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(n))
    assert epochs[0] != epochs[1] and epochs[0] != list(range(n))


def _global_order(directory: Path, dp_size: int, start: int = 0, steps: int = 6, batch: int = 2,
                  accumulate: int = 1, **options) -> list[list[int]]:
    """The first token of every sample each step trains on, over dp_size ranks, in the global order."""
    loaders = [build_dataloader(dataset_type="indexed", path=directory, seq_len=8, micro_batch_size=batch,
                                dp_rank=r, dp_size=dp_size, grad_accum=accumulate, vocab_size=256, seed=3,
                                shuffle=True, start_sample=start, **options) for r in range(dp_size)]
    steps_seen = []
    for _ in range(steps):
        step = []
        for loader in loaders:
            for _ in range(accumulate):
                step += loader.next_batch()["input_ids"][:, :4].tolist()
        steps_seen.append(step)
    return steps_seen


def test_the_order_is_the_same_at_every_world_size_and_resumes_anywhere(tmp_path):
    directory = shards(tmp_path, random_documents(300, seed=4))
    one = _global_order(directory, 1, batch=8)
    assert _global_order(directory, 2, batch=4) == one
    assert _global_order(directory, 4, batch=1, accumulate=2) == one
    # a resume at step 3, on another world size, continues the same order
    assert _global_order(directory, 2, batch=4, start=3 * 8, steps=3) == one[3:]
    # far past the data: no scan, the same function of the index
    far = build_dataloader(dataset_type="indexed", path=directory, seq_len=8, micro_batch_size=1, dp_rank=0,
                           dp_size=1, vocab_size=256, seed=3, shuffle=True, start_sample=10**12)
    source = far.source
    epoch, i = divmod(10**12, source.rows[0])
    want_row = int(Permutation(source.rows[0], seed=3 * 1_000_003, epoch=epoch)([i])[0])
    assert far.next_batch()["input_ids"][0].tolist() == source.streams[0].row(want_row, 8)[0].tolist()


def test_shuffle_off_reads_in_packing_order(tmp_path):
    docs = random_documents(50, seed=6)
    directory = shards(tmp_path, docs)
    loader = build_dataloader(dataset_type="indexed", path=directory, seq_len=8, micro_batch_size=4, dp_rank=0,
                              dp_size=1, vocab_size=256)
    assert loader.next_batch()["input_ids"].tolist() == [reference_row(docs, i, 8)[0] for i in range(4)]


def test_a_mixture_of_channels_through_the_loader(tmp_path):
    web = shards(tmp_path, [[1] * 7] * 40, name="web")  # every token says which channel it came from
    code = shards(tmp_path, [[2] * 7] * 40, name="code")
    loader = build_dataloader(dataset_type="indexed", path=None, seq_len=7, micro_batch_size=1000, dp_rank=0,
                              dp_size=1, vocab_size=256, seed=1, shuffle=True, mixture=(("web", 3), ("code", 1)),
                              channels={"web": web, "code": code, "train": web})
    first = loader.next_batch()["input_ids"][:, 0]
    assert (first == 1).sum() == 750 and (first == 2).sum() == 250
    with pytest.raises(ValueError, match="data_mixture names channel.s. books, which this job does not have"):
        build_dataloader(dataset_type="indexed", seq_len=7, micro_batch_size=1, dp_rank=0, dp_size=1, vocab_size=256,
                         mixture=(("books", 1.0),), channels={"web": web})


def test_the_validation_loader_reads_a_channel_once_in_order(tmp_path):
    docs = random_documents(30, seed=7)
    directory = shards(tmp_path, docs, name="validation")
    rows = TokenStream(directory).rows(8)
    batches = list(build_validation_loader(dataset_type="indexed", path=directory, seq_len=8, micro_batch_size=2,
                                           dp_rank=0, dp_size=1, vocab_size=256))
    assert len(batches) == rows // 2
    assert batches[0]["input_ids"][0].tolist() == reference_row(docs, 0, 8)[0]


def test_shuffle_is_for_indexed_shards_and_jsonl_channels_of_shards_are_named(tmp_path):
    directory = shards(tmp_path, random_documents(20))
    with pytest.raises(ValueError, match="set dataset_type: indexed to read them"):
        build_dataloader(dataset_type="jsonl", path=directory, seq_len=8, micro_batch_size=1, dp_rank=0, dp_size=1,
                         vocab_size=256)
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"input_ids": list(range(8))}) + "\n")
    with pytest.raises(ValueError, match="shuffle applies to indexed token shards"):
        build_dataloader(dataset_type="jsonl", path=records, seq_len=8, micro_batch_size=1, dp_rank=0, dp_size=1,
                         vocab_size=256, shuffle=True)
