"""Data loading: global order independent of parallelism, streaming, resume, labels (packing: test_pack)."""

import gzip
import json
from pathlib import Path

import pytest
import torch

from container.data import loader as data
from container.data.loader import IGNORE_INDEX, build_dataloader, build_validation_loader

SEQ = 4
VOCAB = 10_000
N_RECORDS = 13  # prime, so global batches straddle the end of the data (epochs wrap mid-batch)


def record(i: int) -> dict:
    """Record i's tokens start with i, so a batch shows which records it holds."""
    ids = [i, i + 1000, i + 2000, i + 3000]
    return {"input_ids": ids, "attention_mask": [1] * SEQ, "labels": ids}


def write(path: Path, indices, compress: bool = False) -> Path:
    lines = "".join(json.dumps(record(i)) + "\n" for i in indices)
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(lines)
    else:
        path.write_text(lines)
    return path


@pytest.fixture
def channel(tmp_path) -> Path:
    """13 records over three files, one gzipped, plus a file the loader must ignore."""
    d = tmp_path / "train"
    d.mkdir()
    write(d / "part-0.jsonl", range(5))
    write(d / "part-1.json.gz", range(5, 9), compress=True)
    write(d / "part-2.json", range(9, 13))
    (d / "README.txt").write_text("not data")
    return d


def loader(kind, path, *, mb, dp_rank=0, dp=1, ga=1, start=0):
    return build_dataloader(dataset_type=kind, path=path, seq_len=SEQ, micro_batch_size=mb, dp_rank=dp_rank,
                            dp_size=dp, grad_accum=ga, vocab_size=VOCAB, seed=7, start_sample=start)


def first_tokens(batch) -> list[int]:
    return batch["input_ids"][:, 0].tolist()


def step_from_all_ranks(loaders, ga):
    """One optimizer step's micro-batches of every rank, in (rank, micro-batch) order."""
    batches = [[ld.next_batch() for _ in range(ga)] for ld in loaders]
    return {k: torch.cat([b[k] for rank in batches for b in rank]) for k in ("input_ids", "labels")}


@pytest.mark.parametrize("kind", ["jsonl", "synthetic"])
@pytest.mark.parametrize("dp, ga", [(2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (8, 1)])
def test_global_order_is_independent_of_world_size_and_accumulation(channel, kind, dp, ga):
    global_batch, steps = 8, 5  # 40 samples: three passes over the 13 records
    reference = loader(kind, channel, mb=global_batch)
    ranks = [loader(kind, channel, mb=global_batch // (dp * ga), dp_rank=r, dp=dp, ga=ga) for r in range(dp)]
    for _ in range(steps):
        expected, got = reference.next_batch(), step_from_all_ranks(ranks, ga)
        assert torch.equal(got["input_ids"], expected["input_ids"])
        assert torch.equal(got["labels"], expected["labels"])


def test_sample_i_is_record_i_mod_n_across_files_in_sorted_order(channel):
    ld = loader("jsonl", channel, mb=8)
    seen = first_tokens(ld.next_batch()) + first_tokens(ld.next_batch()) + first_tokens(ld.next_batch())
    assert seen == [i % N_RECORDS for i in range(24)]


def test_rank_takes_a_contiguous_slice_and_micro_batches_in_order(channel):
    ld = loader("jsonl", channel, mb=2, dp_rank=1, dp=2, ga=2)  # step = 8 samples, rank 1 owns 4..7
    assert [first_tokens(ld.next_batch()) for _ in range(4)] == [[4, 5], [6, 7], [12, 0], [1, 2]]


class _CountingFile:
    def __init__(self, f, log):
        self.f, self.log = f, log

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __iter__(self):
        for line in self.f:
            self.log.append(line)
            yield line


@pytest.fixture
def lines_read(monkeypatch) -> list:
    """Every line the loader takes from a file, in order."""
    log, real_open = [], data.open_text
    monkeypatch.setattr(data, "open_text", lambda p: _CountingFile(real_open(p), log))
    return log


def test_lines_are_streamed_not_loaded(tmp_path, lines_read):
    path = write(tmp_path / "big.jsonl", range(1000))
    ld = loader("jsonl", path, mb=2, dp_rank=1, dp=2)
    assert first_tokens(ld.next_batch()) == [2, 3]
    assert len(lines_read) == 4  # rank 1 skips rank 0's two lines; nothing beyond its own


@pytest.mark.parametrize("kind", ["jsonl", "synthetic"])
def test_resume_continues_exactly_even_with_other_parallelism(channel, kind):
    run = [loader(kind, channel, mb=2, dp_rank=r, dp=2, ga=2) for r in range(2)]
    for _ in range(3):
        step_from_all_ranks(run, 2)
    state = run[0].state_dict()
    assert state == run[1].state_dict() == {"next_sample": 24}
    continued = [step_from_all_ranks(run, 2)["input_ids"] for _ in range(3)]

    same_shape = [loader(kind, channel, mb=2, dp_rank=r, dp=2, ga=2) for r in range(2)]
    for ld in same_shape:
        ld.load_state_dict(state)
    single = loader(kind, channel, mb=8)
    single.load_state_dict(state)
    for expected in continued:
        assert torch.equal(step_from_all_ranks(same_shape, 2)["input_ids"], expected)
        assert torch.equal(single.next_batch()["input_ids"], expected)


def test_start_far_ahead_skips_whole_epochs(channel, lines_read):
    start = 1000 * N_RECORDS + 3
    ld = loader("jsonl", channel, mb=4, start=start)
    assert first_tokens(ld.next_batch()) == [(start + j) % N_RECORDS for j in range(4)]
    assert len(lines_read) == N_RECORDS + 3 + 4  # one pass to count the records, then the offset
    ld.load_state_dict({"next_sample": 5})  # going back restarts the stream
    assert first_tokens(ld.next_batch()) == [5, 6, 7, 8]


def test_state_between_micro_batches_is_refused(channel):
    ld = loader("jsonl", channel, mb=1, ga=2)
    ld.next_batch()
    with pytest.raises(RuntimeError, match="between optimizer steps"):
        ld.state_dict()


def test_labels_are_shifted_with_ignore_at_the_end(channel):
    batch = loader("jsonl", channel, mb=3).next_batch()
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.dtype == labels.dtype == torch.long and ids.shape == labels.shape == (3, SEQ)
    assert torch.equal(labels[:, :-1], ids[:, 1:])
    assert (labels[:, -1] == IGNORE_INDEX).all()


def test_record_labels_and_attention_mask_are_honoured(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2, 3, 4], "labels": [1, -100, 7, 8],
                                "attention_mask": [1, 1, 1, 0]}) + "\n")
    labels = loader("jsonl", path, mb=1).next_batch()["labels"]
    # shifted record labels [-100, 7, 8, -100]; the padded last target (mask 0) is ignored too
    assert labels.tolist() == [[IGNORE_INDEX, 7, IGNORE_INDEX, IGNORE_INDEX]]


@pytest.mark.parametrize("ids, words", [([1, 2, 3], "3 tokens"), ([1, 2, 3, 4, 5], "5 tokens")])
def test_wrong_length_record_names_file_and_line(tmp_path, ids, words):
    path = write(tmp_path / "bad.jsonl", range(2))
    with path.open("a") as f:
        f.write(json.dumps({"input_ids": ids}) + "\n")
    ld = loader("jsonl", path, mb=3)
    with pytest.raises(ValueError, match=rf"bad.jsonl:3: input_ids has {words}.*pack --block-size 4"):
        ld.next_batch()


def test_out_of_vocabulary_and_malformed_records(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2, 3, VOCAB]}) + "\n" + '{"tokens": [1, 2, 3, 4]}\n')
    ld = loader("jsonl", path, mb=1)
    with pytest.raises(ValueError, match=rf"bad.jsonl:1: token id {VOCAB} outside"):
        ld.next_batch()
    ld = loader("jsonl", path, mb=1, start=1)
    with pytest.raises(ValueError, match="bad.jsonl:2: expected a JSON object"):
        ld.next_batch()


def test_missing_or_empty_data_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="no data files"):
        loader("jsonl", tmp_path, mb=1)
    with pytest.raises(FileNotFoundError, match="no such file"):
        loader("jsonl", tmp_path / "nope", mb=1)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        loader("jsonl", tmp_path, mb=1).next_batch()
    with pytest.raises(ValueError, match="dataset_type"):
        loader("parquet", tmp_path, mb=1)


def test_synthetic_is_a_deterministic_function_of_seed_and_index():
    a = loader("synthetic", None, mb=4).next_batch()["input_ids"]
    b = loader("synthetic", None, mb=2, start=2).next_batch()["input_ids"]
    assert torch.equal(a[2:], b)
    assert a.min() >= 0 and a.max() < VOCAB
    other_seed = build_dataloader(dataset_type="synthetic", seq_len=SEQ, micro_batch_size=4, dp_rank=0,
                                  dp_size=1, vocab_size=VOCAB, seed=8).next_batch()["input_ids"]
    assert not torch.equal(a, other_seed)


def validation(kind, path, *, mb, dp_rank, dp, max_batches=None):
    return build_validation_loader(dataset_type=kind, path=path, seq_len=SEQ, micro_batch_size=mb,
                                   dp_rank=dp_rank, dp_size=dp, vocab_size=VOCAB, seed=7,
                                   max_batches=max_batches)


def test_validation_takes_whole_global_batches_from_the_start_each_pass(channel):
    # 13 records, global batch 4: three whole batches; the 13th record is left out on every rank
    ranks = [validation("jsonl", channel, mb=2, dp_rank=r, dp=2) for r in range(2)]
    passes = [[first_tokens(b) for b in ranks[r]] for r in (0, 1, 0)]
    assert passes[0] == [[0, 1], [4, 5], [8, 9]]
    assert passes[1] == [[2, 3], [6, 7], [10, 11]]
    assert passes[2] == passes[0]
    assert len(list(validation("jsonl", channel, mb=2, dp_rank=1, dp=2, max_batches=2))) == 2
    assert len(list(validation("jsonl", channel, mb=2, dp_rank=1, dp=2, max_batches=-1))) == 3  # seed: all
    # dp 4: rank 0 could read record 12, but ranks 1-3 have nothing for that batch
    assert [first_tokens(b) for b in validation("jsonl", channel, mb=1, dp_rank=0, dp=4)] == [[0], [4], [8]]


def test_synthetic_validation_differs_from_training_and_needs_a_limit():
    val = [b["input_ids"] for b in validation("synthetic", None, mb=2, dp_rank=0, dp=1, max_batches=3)]
    assert len(val) == 3
    train = loader("synthetic", None, mb=2).next_batch()["input_ids"]
    assert not torch.equal(val[0], train)
    with pytest.raises(ValueError, match="max_batches"):
        validation("synthetic", None, mb=2, dp_rank=0, dp=1)
