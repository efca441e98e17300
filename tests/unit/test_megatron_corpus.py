"""Megatron-Core corpora read in place (launcher.wire.megatron_index, container.data.megatron),
checked against megatron-core itself: corpora written by its IndexedDatasetBuilder, for every
integer dtype it writes and several document shapes, are read by smlaunch document for document as
its IndexedDataset reads them; rows of such a corpus train as the same documents packed in
smlaunch's own shards; damaged files and float tokens are errors naming the file, at validate too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from container.data.indexed import TokenStream, write_shards
from container.data.indexed_source import Channel, IndexedSource
from launcher.cli.app import main
from launcher.wire import checkpoints
from launcher.wire.megatron_index import _stdlib_range, token_range
from launcher.wire.token_shards import ShardError, read_header
from launcher.wire.training.resume import compare
from tests.support import megatron
from tests.support.cli import ROOT
from tests.support.megatron import build, smlaunch_documents


@pytest.fixture(scope="module", autouse=True)
def _megatron_core():
    """megatron-core's reader, imported by the worker that runs this module, not at every worker's
    collection (it imports wandb: ~1.9 CPU s); the module skips where megatron-core is absent."""
    megatron.indexed_dataset()


# its builder's numpy.array(tensor) under numpy 2 (megatron-core's, not smlaunch's)
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16]
BYTES = {"name": "UTF-8 bytes", "vocabulary_sha256": None}


def documents(seed: int, count: int = 40, vocab: int = 100) -> list[list[list[int]]]:
    """Documents as lists of sequences (sentences), some of them empty, as preprocess_data.py with
    --split-sentences makes them."""
    g = np.random.default_rng(seed)
    return [[g.integers(0, vocab, g.integers(0, 30)).tolist() for _ in range(g.integers(0, 4))]
            for _ in range(count)]


def megatron_documents(prefix: Path) -> list[list[int]]:
    """Each document's tokens as Megatron's own reader gives them: its sequences, back to back."""
    dataset = megatron.indexed_dataset().IndexedDataset(str(prefix))
    index = dataset.document_indices
    return [[int(t) for s in range(index[d], index[d + 1]) for t in dataset[s]] for d in range(len(index) - 1)]


# --- every document as Megatron's reader gives it ------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("how", ["items", "documents"])
def test_every_document_reads_as_megatrons_indexed_dataset_reads_it(tmp_path, dtype, how):
    docs = documents(seed=DTYPES.index(dtype)) + [[[1, 2, 3]], [], [[], [4]]]  # one, no, and an empty sequence
    channel = build(tmp_path / "train" / "web_text_document", docs, dtype, how)
    stream = TokenStream(channel)
    expected = megatron_documents(tmp_path / "train" / "web_text_document")
    assert expected == [[t for s in doc for t in s] for doc in docs]  # the reference reads what was written
    assert smlaunch_documents(stream) == expected
    header = stream.header
    assert (header.dtype, header.documents, header.tokens) == (dtype.__name__, len(docs), sum(map(len, expected)))
    assert header.describe().startswith(f"Megatron MMIDIDX v1, {dtype.__name__}, {len(docs)} documents")
    ids = [t for d in expected for t in d]
    assert token_range(header, chunk_tokens=7) == (min(ids), max(ids))
    assert _stdlib_range(header, chunk_tokens=7) == (min(ids), max(ids))  # a client without numpy


def test_rows_mark_megatrons_documents_and_cross_its_files(tmp_path):
    first, second = documents(seed=1), documents(seed=2)
    build(tmp_path / "train" / "a_document", first)
    build(tmp_path / "train" / "b_document", second, how="documents")
    stream = TokenStream(tmp_path / "train")
    flat = [[t for s in doc for t in s] for doc in first + second]
    tokens, starts = [], []
    for doc in flat:
        tokens += doc
        starts += [True] + [False] * (len(doc) - 1) if doc else []
    seq = 16
    for row in range(stream.rows(seq)):
        got_tokens, got_starts = stream.row(row, seq)
        assert got_tokens.tolist() == tokens[row * seq:(row + 1) * seq]
        assert got_starts.tolist() == [True] + starts[row * seq + 1:(row + 1) * seq]


def test_a_megatron_corpus_trains_as_the_same_documents_in_smlaunchs_shards(tmp_path):
    """Every sample of the shuffled, document-masked stream (tokens, labels, positions, documents)
    equals the one of smlaunch's own shards of the same documents: the same job trains the same."""
    docs = documents(seed=3, count=120)
    flat = [[t for s in doc for t in s] for doc in docs]
    build(tmp_path / "megatron" / "corpus_text_document", docs, np.int32)
    write_shards(flat, tmp_path / "smlaunch", "train", vocab_size=100, tokenizer=BYTES)
    sources = [IndexedSource([Channel("train", tmp_path / name)], 16, 100, seed=7, shuffle=True)
               for name in ("megatron", "smlaunch")]
    assert sources[0].rows == sources[1].rows and sources[0].rows[0] > 10
    megatron, smlaunch = (source.read(0, 2 * sources[0].rows[0]) for source in sources)
    assert megatron.keys() == smlaunch.keys() and "positions" in megatron
    for key in megatron:
        assert torch.equal(megatron[key], smlaunch[key]), key


# --- what is refused -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_float_tokens_are_refused_by_name(tmp_path, dtype):
    build(tmp_path / "train" / "floats", [[[1, 2]]], dtype)
    with pytest.raises(ShardError, match=f"floats.idx: its tokens are {dtype.__name__} .*not token ids"):
        read_header(tmp_path / "train" / "floats.idx")


def _damage(idx: Path, how: str) -> None:
    data = idx.read_bytes()
    if how == "short bin":
        idx.with_suffix(".bin").write_bytes(idx.with_suffix(".bin").read_bytes()[:-2])
    elif how == "no bin":
        idx.with_suffix(".bin").unlink()
    elif how == "version":
        idx.write_bytes(data[:9] + (2).to_bytes(8, "little") + data[17:])
    elif how == "dtype code":
        idx.write_bytes(data[:17] + bytes([9]) + data[18:])
    elif how == "short idx":
        idx.write_bytes(data[:-8])
    elif how == "pointers":  # the second sequence's byte offset moved: the tokens would be misread
        at = 34 + 4 * int.from_bytes(data[18:26], "little") + 8
        idx.write_bytes(data[:at] + (4).to_bytes(8, "little") + data[at + 8:])


@pytest.mark.parametrize(("how", "file", "message"), [
    ("short bin", "web.bin", "bytes where web.idx says its sequences end at byte"),
    ("no bin", "web.bin", "missing: the tokens of web.idx"),
    ("version", "web.idx", "Megatron index version 2"),
    ("dtype code", "web.idx", "dtype code 9 is none of Megatron's"),
    ("short idx", "web.idx", "(truncated or mismatched)"),
    ("pointers", "web.idx", "sequence 1 does not start where the one before it ends"),
])
def test_a_damaged_corpus_is_an_error_naming_its_file(tmp_path, how, file, message):
    build(tmp_path / "train" / "web", [[[1, 2, 3]], [[4, 5], [6]], [[7, 8, 9, 10]]])
    assert smlaunch_documents(TokenStream(tmp_path / "train"))[1] == [4, 5, 6]  # the control
    _damage(tmp_path / "train" / "web.idx", how)
    with pytest.raises(ShardError) as error:
        TokenStream(tmp_path / "train")
    assert error.value.path.name == file and message in str(error.value), str(error.value)


def test_a_corpus_beside_smlaunchs_shards_in_one_channel_is_refused(tmp_path):
    build(tmp_path / "train" / "web", [[[1, 2, 3]]])
    write_shards([[1, 2]], tmp_path / "train", "train", vocab_size=100, tokenizer=BYTES)
    with pytest.raises(ShardError, match="keep one format in a channel"):
        TokenStream(tmp_path / "train")


def test_an_id_past_the_models_vocabulary_is_caught_when_its_row_is_read(tmp_path):
    build(tmp_path / "train" / "web", [[[1, 2, 3, 4, 5, 6, 7, 8]], [[9, 10, 11, 12, 13, 14, 15, 99]]])
    source = IndexedSource([Channel("train", tmp_path / "train")], 8, 50, seed=0, shuffle=False)
    assert source.read(0, 1)["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]  # the control
    with pytest.raises(ShardError, match="row 1 of channel train holds token id 99 outside the vocabulary"):
        source.read(1, 1)


# --- validate ------------------------------------------------------------------------------------

def validate(tmp_path: Path, train: Path, **hyperparameters) -> tuple[int, str]:
    hp = {"model_preset": "llama3-tiny", "max_context_width": 8, "dataset_type": "indexed", "vocab_size": 256,
          **hyperparameters}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 1, "processes_per_host": 1, "inputs": {"train": str(train)},
           "hyperparameters": {k: v for k, v in hp.items() if v is not None}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    result = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
    return result.exit_code, " ".join((result.stdout + result.stderr).split())


def test_validate_names_the_format_and_checks_ids_vocabulary_and_files(tmp_path):
    docs = [[[1, 2, 3, 4]], [[5, 6], [7, 200]]] * 5
    train = build(tmp_path / "train" / "web_text_document", docs, np.int32)
    code, out = validate(tmp_path, train)
    assert code == 0, out
    assert "/train\": web_text_document.idx: Megatron MMIDIDX v1, int32, 10 documents, 40 tokens" in out
    code, out = validate(tmp_path, train, vocab_size=None)
    assert code == 2 and "records neither the tokenizer it was made with nor its vocabulary size" in out, out
    code, out = validate(tmp_path, train, vocab_size=128)
    assert code == 2 and "web_text_document.bin holds token id 200, outside" in out, out
    (train / "web_text_document.bin").write_bytes((train / "web_text_document.bin").read_bytes()[:-4])
    code, out = validate(tmp_path, train)
    assert code == 2 and "web_text_document.bin: 156 bytes where web_text_document.idx says" in out, out


def test_a_rebuilt_corpus_of_the_same_sizes_is_named_on_resume(tmp_path):
    build(tmp_path / "train" / "web", [[[1, 2, 3, 4]], [[5, 6]]])
    saved = checkpoints.data_streams("indexed", True, {"train": tmp_path / "train"})
    assert not compare(saved, checkpoints.data_streams("indexed", True, {"train": tmp_path / "train"})).warnings
    build(tmp_path / "train" / "web", [[[1, 2, 3, 4]], [[5, 7]]])  # one token changed: the same sizes
    changes = compare(saved, checkpoints.data_streams("indexed", True, {"train": tmp_path / "train"}))
    assert [str(c) for c in changes.warnings][0].startswith("channel train changed since the checkpoint was saved: "
                                                            "1 shard(s) changed in content (web.idx)")


def test_the_job_refuses_a_corpus_whose_vocabulary_it_was_not_told(tmp_path):
    """What validate says, the container says too (a job built by hand, an S3 channel)."""
    from container.checkpoint.pretrained import Sources
    from container.run_data import check_tokenizer

    build(tmp_path / "train" / "web", [[[1, 2, 3, 4]]] * 4)
    source = IndexedSource([Channel("train", tmp_path / "train")], 8, 50, seed=0, shuffle=False)
    check_tokenizer(source, Sources(None, None, False), vocab_size_given=True)  # the control
    with pytest.raises(ShardError, match="channel train holds a Megatron MMIDIDX v1 corpus, which records neither"):
        check_tokenizer(source, Sources(None, None, False), vocab_size_given=False)


# --- python -m container.data inspect ------------------------------------------------------------

def test_inspect_prints_every_document_as_megatrons_reader_gives_it(tmp_path, capsys):
    from container.data.inspect_corpus import main as inspect

    build(tmp_path / "train" / "a_document", documents(seed=4), np.int16)
    build(tmp_path / "train" / "b_document", documents(seed=5), np.int16, how="documents")
    expected = megatron_documents(tmp_path / "train" / "a_document") + megatron_documents(tmp_path / "train" /
                                                                                          "b_document")
    assert inspect([str(tmp_path / "train"), "--documents", "0:", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"document": i, "input_ids": ids} for i, ids in enumerate(expected)]
    assert inspect([str(tmp_path / "train"), "--documents", "38:42", "--json"]) == 0  # across the two files
    assert [json.loads(line)["input_ids"] for line in capsys.readouterr().out.splitlines()] == expected[38:42]
    assert inspect([str(tmp_path / "train"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    lengths = [len(d) for d in expected]
    assert report["documents"] == len(expected) and report["tokens"] == sum(lengths)
    assert [f["format"] for f in report["files"]] == ["Megatron MMIDIDX v1"] * 2
    assert report["files"][0]["tokenizer"] is None and report["files"][0]["dtype"] == "int16"
    by_hand = {}
    for length in lengths:
        row = by_hand.setdefault(str(max(length, 1).bit_length() - 1), [0, 0])
        row[0], row[1] = row[0] + 1, row[1] + length
    assert report["lengths"] == dict(sorted(by_hand.items(), key=lambda kv: int(kv[0])))


# --- pack --format megatron ----------------------------------------------------------------------

def test_pack_format_megatron_writes_what_megatrons_reader_reads(tmp_path, capsys):
    """The other way: smlaunch packs, Megatron's IndexedDataset reads every document, split by
    document and cut into pairs as --format indexed cuts shards; the job reads them the same."""
    from container.data.packing import is_validation
    from tests.support.pack import DOCS, run, write_docs

    src = write_docs(tmp_path / "src", DOCS)
    assert run("--input", src, "--format", "megatron", "--output-dir", tmp_path / "data", "--shard-tokens", 400,
               "--validation-fraction", 0.25, "--seed", 3) == 0
    assert "wrote Megatron-Core .bin/.idx pairs (train: " in capsys.readouterr().out
    want = [list(text.encode()) for text in DOCS]  # UTF-8 bytes: no --tokenizer
    split = [is_validation(i, 0.25, 3) for i in range(len(DOCS))]
    for name, in_split in (("train", False), ("validation", True)):
        prefixes = sorted(p.with_suffix("") for p in (tmp_path / "data" / name).glob("*.idx"))
        assert len(prefixes) > (name == "train")  # the train split takes several pairs
        read = [doc for prefix in prefixes for doc in megatron_documents(prefix)]
        assert read == [d for d, v in zip(want, split) if v == in_split], name
        assert smlaunch_documents(TokenStream(tmp_path / "data" / name)) == read
    assert megatron.indexed_dataset().IndexedDataset(str(prefixes[0])).index.dtype == np.uint16


def test_a_vocabulary_past_65500_ids_is_packed_as_int32_as_megatron_chooses(tmp_path):
    from container.data.megatron_writer import MegatronWriter

    docs = [[0, 65_535, 69_999], [], [12]]
    with MegatronWriter(tmp_path / "train", "train", vocab_size=70_000, tokenizer=BYTES) as writer:
        for doc in docs:
            writer.add(doc)
    dataset = megatron.indexed_dataset().IndexedDataset(str(tmp_path / "train" / "train-00000"))
    assert dataset.index.dtype == megatron.indexed_dataset().DType.optimal_dtype(70_000) == np.int32
    assert megatron_documents(tmp_path / "train" / "train-00000") == docs


# --- the documents' lengths: inspect and the planner ---------------------------------------------

def test_a_corpus_lengths_are_those_smlaunchs_header_records_of_the_same_documents(tmp_path, monkeypatch):
    from launcher.wire.megatron_index import length_buckets

    docs = documents(seed=6, count=300) + [[[]], [[1] * 70_000]]  # an empty document, one past 2^16
    build(tmp_path / "megatron" / "web", docs, np.int32)
    write_shards([[t for s in doc for t in s] for doc in docs], tmp_path / "smlaunch", "train", vocab_size=100,
                 tokenizer=BYTES)
    recorded = read_header(tmp_path / "smlaunch" / "train-00000.idx").fields["lengths"]["buckets"]
    header = read_header(tmp_path / "megatron" / "web.idx")
    assert length_buckets(header, chunk=64) == recorded
    monkeypatch.setitem(sys.modules, "numpy", None)  # a client without numpy: the stdlib's reading
    assert length_buckets(header, chunk=64) == recorded


def test_the_planner_reads_a_corpus_lengths_as_it_reads_smlaunchs_shards(tmp_path):
    docs = [[[7] * 1000, [8] * 24]] * 40  # documents of 1,024 tokens, two sequences each
    build(tmp_path / "megatron" / "web", docs, np.int32)
    write_shards([[t for s in doc for t in s] for doc in docs], tmp_path / "smlaunch", "train",
                 vocab_size=128_256, tokenizer=BYTES)

    def plan(channel: Path) -> str:
        result = CliRunner().invoke(main, ["plan", str(ROOT / "configs" / "seed" / "p5-cp8-bf16.yaml"), "--set",
                                           "hyperparameters.dataset_type=indexed", "--data", str(channel)])
        assert result.exit_code in (0, 1), result.output
        return " ".join(result.output.split())

    megatron = plan(tmp_path / "megatron")
    assert "attend 1,024 tokens per token on average with document masking" in megatron
    assert megatron.replace(str(tmp_path / "megatron"), "X") == plan(tmp_path / "smlaunch").replace(
        str(tmp_path / "smlaunch"), "X")


def test_a_resume_with_another_tokenizer_given_is_refused_where_both_are_known(tmp_path):
    build(tmp_path / "train" / "web", [[[1, 2, 3, 4]], [[5, 6]]])
    llama, mistral = ({"name": name, "vocabulary_sha256": digit * 64} for name, digit in (("llama", "a"), ("m", "b")))

    def record(tokenizer):
        return checkpoints.data_streams("indexed", True, {"train": tmp_path / "train"}, tokenizer=tokenizer)

    assert not compare(record(llama), record(dict(llama, name="./llama"))).refusals  # the control: a label
    refused = compare(record(llama), record(mistral)).refusals
    assert [str(c) for c in refused][0].startswith("channel train was read as tokens of llama (vocabulary sha256 "
                                                   "aaaaaaaaaaaaaaaa...) when the checkpoint was saved, and is now "
                                                   "read as tokens of m (vocabulary sha256 bbbbbbbbbbbbbbbb...)")
    assert not compare(record(llama), record(None)).refusals  # validate, without the tokenizer here
