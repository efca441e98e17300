"""Making data sets (container.data.packing): the blocks equal a reference computed here with
transformers' own AutoTokenizer and the seed's group_texts, for every kind of input; the
train/validation split; the summary; bad inputs that fail with one line and leave nothing.
Here the tests that run in one process; those that start processes are tests/integration/test_pack.py."""

import gzip
import hashlib
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from container.data.loader import build_dataloader
from container.data.packing import byte_detokenize, byte_tokenize, pack, write_jsonl
from tests.support.pack import (
    BLOCK,
    DOCS,
    _save_tokenizer,
    blocks,
    reference,
    run,
    summary,
    write_docs,
    written_records,
)


def write_jsonl_records(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open(path, "wt") if path.name.endswith(".gz") else path.open("w")) as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


# --- the seed's group_texts, byte tokens ----------------------------------------------------

def test_pack_concatenates_and_drops_the_remainder():
    got = pack(["abc", "defgh", "ij"], byte_tokenize, 3)
    assert [byte_detokenize(b) for b in got] == ["abc", "def", "ghi"]  # "j" dropped


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=10), st.integers(1, 12))
def test_pack_equals_group_texts(texts, block_size):
    ids = [t for text in texts for t in byte_tokenize(text)]
    whole = len(ids) // block_size * block_size
    expected = [ids[i:i + block_size] for i in range(0, whole, block_size)]
    assert list(pack(texts, byte_tokenize, block_size)) == expected


def test_byte_tokenizer_round_trip():
    text = "Llama 3.1 — 16 384 tokens, ü, 日本語, 🦙\n"
    ids = byte_tokenize(text)
    assert all(0 <= i < 256 for i in ids)
    assert byte_detokenize(ids) == text


def test_write_jsonl_writes_the_seeds_record_layout(tmp_path):
    assert write_jsonl(pack(["hello world!"], byte_tokenize, 4), tmp_path / "out.jsonl.gz") == 3
    assert blocks(tmp_path / "out.jsonl.gz")[0] == byte_tokenize("hell")
    batch = build_dataloader(dataset_type="jsonl", path=tmp_path, seq_len=4, micro_batch_size=3,
                             dp_rank=0, dp_size=1, vocab_size=256).next_batch()
    assert byte_detokenize(batch["input_ids"].flatten().tolist()) == "hello world!"


def test_byte_tokens_from_text_files(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a" * 10)
    (src / "sub" / "b.py").write_text("b" * 10)
    (src / "skip.bin").write_bytes(b"\x00" * 10)
    assert run("--input", src, "--output", tmp_path / "out.jsonl", "--block-size", 6) == 0
    # a.txt, then sub/b.py; skip.bin is no text file
    assert [byte_detokenize(b) for b in blocks(tmp_path / "out.jsonl")] == ["aaaaaa", "aaaabb", "bbbbbb"]


def test_the_summary_counts_documents_tokens_and_the_dropped_remainder(tmp_path, capsys):
    src = write_docs(tmp_path / "src", ["abc", "defgh", "ij"])
    assert run("--input", src, "--output", tmp_path / "a.jsonl", "--block-size", 3) == 0
    out, err = capsys.readouterr()
    assert err == ""  # no progress display off a terminal
    # one --output file is no split: it may be a validation channel's file (issue 38, item 8)
    assert summary(out) == {"blocks": 3, "block_size": 3, "where": f"3 in {tmp_path / 'a.jsonl'}",
                            "documents": 3, "tokens": 10, "left_over": 1, "why": "the last incomplete block",
                            "vocab_size": 256}
    assert run("--input", src, "--output", tmp_path / "b.jsonl", "--block-size", 3, "--max-blocks", 2) == 0
    s = summary(capsys.readouterr().out)
    assert (s["blocks"], s["documents"], s["tokens"], s["left_over"], s["why"]) == (
        2, 2, 8, 2, "stopped at --max-blocks")  # "defgh" completed block 2; "gh" is left over
    assert run("--input", src, "--output", tmp_path / "c.jsonl", "--block-size", 3, "--max-documents", 2) == 0
    s = summary(capsys.readouterr().out)
    assert (s["blocks"], s["documents"], s["tokens"], s["left_over"]) == (2, 2, 8, 2)


def test_a_validation_file_is_not_called_train_and_the_channels_are_named(tmp_path, capsys):
    src = write_docs(tmp_path / "src", ["abcdef" * 20])
    assert run("--input", src, "--output", tmp_path / "validation.jsonl", "--block-size", 4) == 0
    assert summary(capsys.readouterr().out)["where"] == f"30 in {tmp_path / 'validation.jsonl'}"
    # the control: --output-dir writes the channels, each named
    assert run("--input", src, "--output-dir", tmp_path / "d", "--block-size", 4, "--validation-fraction", 0.5) == 0
    where = summary(capsys.readouterr().out)["where"]
    assert where.startswith("train ") and f"in {tmp_path / 'd/train/train.jsonl'}, validation " in where
    assert where.endswith(f"in {tmp_path / 'd/validation/validation.jsonl'}")


def test_the_help_describes_each_formats_files(capsys):
    """--format indexed writes shards, not JSON Lines (the help once said JSON Lines only)."""
    assert run("--help") == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "indexed token shards of whole documents (--format indexed)" in text
    assert "--format indexed writes the shards DIR/train/train-00000.{bin,idx}" in text
    assert "--format jsonl writes DIR/train/train.jsonl" in text  # the control
    assert "one .jsonl or .jsonl.gz file (--format jsonl)" in text


# --- a model's tokenizer: every kind of input equals the reference --------------------------

def test_text_files_with_a_tokenizer(tmp_path, tokenizer_dir, capsys):
    src = write_docs(tmp_path / "docs", DOCS)
    assert run("--input", src, "--tokenizer", tokenizer_dir, "--output", tmp_path / "out.jsonl",
               "--block-size", BLOCK) == 0
    expected, tokens = reference(tokenizer_dir, DOCS)
    assert blocks(tmp_path / "out.jsonl") == expected
    assert sum(b.count(0) for b in expected) > 30  # <s> (id 0) starts the documents by default
    s = summary(capsys.readouterr().out)
    from transformers import AutoTokenizer

    assert (s["documents"], s["tokens"], s["blocks"], s["left_over"], s["vocab_size"]) == (
        len(DOCS), tokens, len(expected), tokens % BLOCK, len(AutoTokenizer.from_pretrained(tokenizer_dir)))


def test_blocks_mark_their_documents_and_a_cut_document_starts_again(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a" * 10)
    (src / "sub" / "b.py").write_text("b" * 10)
    assert run("--input", src, "--output", tmp_path / "out.jsonl", "--block-size", 6) == 0
    # "aaaaaa", "aaaa|bb" (b.py starts), "bbbbbb" (the rest of b.py: a new document in its block)
    assert [r["position_ids"] for r in written_records(tmp_path / "out.jsonl")] == [
        [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]]
    loader = build_dataloader(dataset_type="jsonl", path=tmp_path / "out.jsonl", seq_len=6, micro_batch_size=3,
                              dp_rank=0, dp_size=1, vocab_size=256)
    assert loader.next_batch()["documents"].tolist() == [[0] * 6, [0, 0, 0, 0, 1, 1], [0] * 6]

    assert run("--input", src, "--output", tmp_path / "seed.jsonl", "--block-size", 6, "--no-position-ids") == 0
    seed_fields = ["input_ids", "attention_mask", "labels"]
    assert [list(r) for r in written_records(tmp_path / "seed.jsonl")] == [seed_fields] * 3



def test_jsonl_with_a_text_field_and_no_special_tokens(tmp_path, tokenizer_dir):
    records = ({"id": i, "content": t} for i, t in enumerate(DOCS))
    path = write_jsonl_records(tmp_path / "docs.jsonl.gz", records)
    assert run("--input", path, "--text-field", "content", "--tokenizer", tokenizer_dir,
               "--no-add-special-tokens", "--output", tmp_path / "out.jsonl.gz", "--block-size", BLOCK) == 0
    expected, _ = reference(tokenizer_dir, DOCS, add_special_tokens=False)
    assert blocks(tmp_path / "out.jsonl.gz") == expected
    assert not any(0 in b for b in expected)


def test_parquet_and_jsonl_files_of_a_directory_in_name_order(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"n": list(range(25)), "text": DOCS[:25]}), src / "a.parquet", row_group_size=7)
    write_jsonl_records(src / "b.jsonl", ({"text": t} for t in DOCS[25:]))
    (src / "c.json").write_text('{"not": "JSON Lines"}\n')  # a directory reads no .json: many are not
    assert run("--input", src, "--tokenizer", tokenizer_dir, "--output", tmp_path / "out.jsonl",
               "--block-size", BLOCK) == 0
    assert blocks(tmp_path / "out.jsonl") == reference(tokenizer_dir, DOCS)[0]


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
    return datasets


def test_datasets_save_to_disk_and_load_dataset_with_and_without_streaming(tmp_path, tokenizer_dir,
                                                                          datasets_cache):
    datasets = datasets_cache
    expected = reference(tokenizer_dir, DOCS)[0]
    datasets.Dataset.from_dict({"text": DOCS, "n": list(range(len(DOCS)))}).save_to_disk(tmp_path / "saved")
    write_jsonl_records(tmp_path / "json" / "part-0.jsonl", ({"text": t} for t in DOCS))
    outputs = {}
    for name, argv in {"saved": ["--dataset", tmp_path / "saved"],
                       "json": ["--dataset", tmp_path / "json"],
                       "json-streamed": ["--dataset", tmp_path / "json", "--streaming"]}.items():
        outputs[name] = tmp_path / f"{name}.jsonl"
        assert run(*argv, "--tokenizer", tokenizer_dir, "--output", outputs[name], "--block-size", BLOCK) == 0
        assert blocks(outputs[name]) == expected, name
    assert outputs["json"].read_bytes() == outputs["json-streamed"].read_bytes()

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS}),
                                   "validation": datasets.Dataset.from_dict({"text": DOCS[:9]})})
    splits.save_to_disk(tmp_path / "splits")
    assert run("--dataset", tmp_path / "splits", "--split", "validation", "--tokenizer", tokenizer_dir,
               "--output", tmp_path / "v.jsonl", "--block-size", BLOCK) == 0
    assert blocks(tmp_path / "v.jsonl") == reference(tokenizer_dir, DOCS[:9])[0]


def test_eos_ends_every_document(tmp_path, tokenizer_dir):
    src = write_docs(tmp_path / "docs", DOCS)
    assert run("--input", src, "--tokenizer", tokenizer_dir, "--eos", "--output", tmp_path / "out.jsonl",
               "--block-size", BLOCK) == 0
    assert blocks(tmp_path / "out.jsonl") == reference(tokenizer_dir, DOCS, eos=True)[0]


# --- the validation split -----------------------------------------------------------------

def is_validation(index: int, fraction: float, seed: int) -> bool:
    """The rule the module docstring documents, computed here independently."""
    h = int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest(), "big")
    return h / 2**64 < fraction


def test_validation_split_is_deterministic_complete_and_about_the_fraction(tmp_path):
    _rng = random.Random(1)
    texts = ["".join(_rng.choice("abcdefgh") for _ in range(4000)) for _ in range(10)]
    src = write_docs(tmp_path / "docs", texts)
    assert run("--input", src, "--output", tmp_path / "all.jsonl", "--block-size", 16) == 0
    everything = blocks(tmp_path / "all.jsonl")
    assert len(everything) == 2500
    for run_dir, seed in (("a", 0), ("b", 0), ("c", 7)):
        assert run("--input", src, "--output-dir", tmp_path / run_dir, "--validation-fraction", 0.1,
                   *(["--seed", seed] if seed else []), "--block-size", 16) == 0
        train = blocks(tmp_path / run_dir / "train/train.jsonl")
        validation = blocks(tmp_path / run_dir / "validation/validation.jsonl")
        picked = [is_validation(i, 0.1, seed) for i in range(len(everything))]
        assert validation == [b for b, v in zip(everything, picked) if v]
        assert train == [b for b, v in zip(everything, picked) if not v]
        assert 0.08 < len(validation) / len(everything) < 0.12
    for name in ("train/train.jsonl", "validation/validation.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other_seed = (tmp_path / "c/validation/validation.jsonl").read_bytes()
    assert (tmp_path / "a/validation/validation.jsonl").read_bytes() != other_seed


def test_output_dir_without_a_fraction_writes_train_only(tmp_path):
    src = write_docs(tmp_path / "docs", ["x" * 100])
    assert run("--input", src, "--output-dir", tmp_path / "data", "--block-size", 10) == 0
    assert sorted(p.relative_to(tmp_path / "data").as_posix() for p in (tmp_path / "data").rglob("*")) == [
        "train", "train/train.jsonl"]


# --- bad inputs: one line, exit 2, nothing written ---------------------------------------------

def _bad_inputs(tmp: Path) -> dict[str, tuple[list, list[str]]]:
    """name: (argv before the output, words the error line must hold)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp / "empty").mkdir()
    (tmp / "empty" / "skip.bin").write_bytes(b"\x00")
    write_jsonl_records(tmp / "field.jsonl", [{"body": "text", "id": 1}])
    # Over a batch (1000 documents) of good records first: blocks are written before the error.
    write_jsonl_records(tmp / "late.jsonl", [{"text": "word " * 20}] * 1500 + [{"title": "t", "url": "u"}])
    write_jsonl_records(tmp / "number.jsonl", [{"text": 5}])
    (tmp / "broken.jsonl").write_text('{"text": "a"}\n{"text": \n')
    (tmp / "garbage.parquet").write_bytes(b"not parquet at all")
    pq.write_table(pa.table({"body": ["a"]}), tmp / "column.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp / "ints.parquet")
    (tmp / "no-tokenizer").mkdir()
    datasets.Dataset.from_dict({"body": ["a"]}).save_to_disk(tmp / "saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}).save_to_disk(tmp / "splits")
    _save_tokenizer(tmp / "no-eos", eos=False)
    (tmp / "short.txt").write_text("short")
    (tmp / "some.txt").write_text("x" * 40)
    size = ["--block-size", 8]
    return {
        "missing file": (["--input", tmp / "missing.txt", *size], ["--input", "missing.txt", "no such file"]),
        "no text files": (["--input", tmp / "empty", *size], ["--input", "empty", "no .txt"]),
        "unknown field": (["--input", tmp / "field.jsonl", *size],
                          ["field.jsonl:1", "no field 'text'", "'body', 'id'", "--text-field"]),
        "bad record mid-stream": (["--input", tmp / "late.jsonl", *size],
                                  ["late.jsonl:1501", "no field 'text'", "'title', 'url'"]),
        "not a string": (["--input", tmp / "number.jsonl", *size], ["number.jsonl:1", "'text' is int"]),
        "not JSON": (["--input", tmp / "broken.jsonl", *size], ["broken.jsonl:2", "not JSON"]),
        "unreadable parquet": (["--input", tmp / "garbage.parquet", *size], ["garbage.parquet", "Parquet"]),
        "parquet column": (["--input", tmp / "column.parquet", *size], ["column.parquet", "'text'", "'body'"]),
        "parquet type": (["--input", tmp / "ints.parquet", *size], ["ints.parquet", "int64, not strings"]),
        "fraction 0": (["--input", tmp / "some.txt", *size, "--validation-fraction", 0],
                       ["--validation-fraction", "'0'", "(0, 1)"]),
        "fraction 1.5": (["--input", tmp / "some.txt", *size, "--validation-fraction", 1.5],
                         ["--validation-fraction", "'1.5'", "(0, 1)"]),
        "fraction without dir": (["--input", tmp / "some.txt", *size, "--validation-fraction", 0.5,
                                  "--output", tmp / "out.jsonl"], ["--validation-fraction", "--output-dir"]),
        "both outputs": (["--input", tmp / "some.txt", *size, "--output", tmp / "out.jsonl", "--output-dir",
                          tmp / "out"],
                         ["--output-dir", "--output"]),
        "block size": (["--input", tmp / "some.txt", "--block-size", 0], ["--block-size", "'0'", "positive"]),
        "output name": (["--input", tmp / "some.txt", *size, "--output", tmp / "out" / "train.txt"],
                        ["--output", "train.txt", ".jsonl"]),
        "tokenizer missing": (["--input", tmp / "some.txt", *size, "--tokenizer", tmp / "nope"],
                              ["--tokenizer", "nope", "no such directory"]),
        "tokenizer empty": (["--input", tmp / "some.txt", *size, "--tokenizer", tmp / "no-tokenizer"],
                            ["--tokenizer", "no-tokenizer", "cannot load"]),
        "eos without tokenizer": (["--input", tmp / "some.txt", *size, "--eos"], ["--eos", "--tokenizer"]),
        "tokenizer without eos": (["--input", tmp / "some.txt", *size, "--eos", "--tokenizer",
                                   tmp / "no-eos"], ["--eos", "no eos_token"]),
        "dataset missing": (["--dataset", tmp / "nope", *size], ["--dataset", "nope", "no such directory"]),
        "dataset field": (["--dataset", tmp / "saved", *size], ["--dataset", "no field 'text'", "'body'"]),
        "dataset split": (["--dataset", tmp / "splits", "--split", "test", *size], ["--split", "test", "train"]),
        "streaming with files": (["--input", tmp / "some.txt", "--streaming", *size], ["--streaming", "--dataset"]),
        "no complete block": (["--input", tmp / "short.txt", "--block-size", 100], ["no complete block", "100"]),
        "no validation block": (["--input", tmp / "some.txt", *size, "--validation-fraction", 0.01],
                                ["--validation-fraction", "validation 0"]),
        "no block size": (["--input", tmp / "some.txt"], ["--block-size is required with --format jsonl"]),
        "indexed with a block size": (["--input", tmp / "some.txt", "--format", "indexed", *size],
                                      ["--block-size applies to --format jsonl", "max_context_width"]),
        "indexed to a file": (["--input", tmp / "some.txt", "--format", "indexed", "--output", tmp / "out.jsonl"],
                              ["--format indexed writes a channel directory", "--output-dir"]),
        "shard tokens for jsonl": (["--input", tmp / "some.txt", *size, "--shard-tokens", 100],
                                   ["--shard-tokens applies to --format indexed"]),
        "indexed mid-stream": (["--input", tmp / "late.jsonl", "--format", "indexed"],
                               ["late.jsonl:1501", "no field 'text'"]),
        "no validation document": (["--input", tmp / "some.txt", "--format", "indexed", "--validation-fraction", 0.01],
                                   ["--validation-fraction", "documents into train 1, validation 0"]),
    }


BAD_INPUTS = [
    "missing file", "no text files", "unknown field", "bad record mid-stream", "not a string", "not JSON",
    "unreadable parquet", "parquet column", "parquet type", "fraction 0", "fraction 1.5",
    "fraction without dir", "both outputs", "block size", "output name", "tokenizer missing",
    "tokenizer empty", "eos without tokenizer", "tokenizer without eos", "dataset missing", "dataset field",
    "dataset split", "streaming with files", "no complete block", "no validation block", "no block size",
    "indexed with a block size", "indexed to a file", "shard tokens for jsonl", "indexed mid-stream",
    "no validation document"]


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    cases = _bad_inputs(tmp)
    assert list(cases) == BAD_INPUTS
    return tmp, cases


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_input_is_one_line_exit_2_and_writes_nothing(case, bad_inputs, capsys):
    tmp, cases = bad_inputs
    argv, words = cases[case]
    out = tmp / "out"
    if "--output" not in argv and "--output-dir" not in argv:
        argv = [*argv, "--output-dir", out]
    assert run(*argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    assert not out.exists() and not (tmp / "out.jsonl").exists()
    assert not [p for p in tmp.rglob("*.tmp")]


def test_not_a_fast_tokenizer(tmp_path, monkeypatch, capsys):
    import transformers

    class Slow:
        is_fast = False

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Slow())
    (tmp_path / "t.txt").write_text("text")
    assert run("--input", tmp_path / "t.txt", "--tokenizer", "some/model", "--output", tmp_path / "o.jsonl",
               "--block-size", 2) == 2
    assert "--tokenizer some/model: Slow is not a fast tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path, capsys):
    src = write_docs(tmp_path / "docs", ["abcdefgh"])
    out = tmp_path / "docs.jsonl"
    out.write_text("old\n")
    assert run("--input", src, "--output", out, "--block-size", 4) == 2
    assert "--output: " in capsys.readouterr().err and out.read_text() == "old\n"
    assert run("--input", src, "--output", out, "--block-size", 4, "--overwrite") == 0
    assert [byte_detokenize(b) for b in blocks(out)] == ["abcd", "efgh"]
    inside = src / "packed.jsonl"  # a directory input reads .jsonl files: this one would be read too
    inside.write_text("old\n")
    assert run("--input", src, "--output", inside, "--block-size", 4, "--overwrite") == 2
    assert "would also be read as --input" in capsys.readouterr().err


# --- --format indexed ---------------------------------------------------------------------------

def test_indexed_shards_hold_the_documents_tokens_and_split_by_document(tmp_path, tokenizer_dir, capsys):
    """With a tokenizer: every document's tokens (the reference: AutoTokenizer, one at a time),
    whole, in order; a validation document is nowhere in train; the header names the tokenizer."""
    from transformers import AutoTokenizer

    from container.data.indexed import TokenStream
    from launcher.wire.token_shards import read_header, vocabulary_sha256

    src = write_docs(tmp_path / "docs", DOCS)
    assert run("--input", src, "--tokenizer", tokenizer_dir, "--eos", "--format", "indexed", "--output-dir",
               tmp_path / "data", "--validation-fraction", 0.25, "--seed", 3, "--shard-tokens", 200) == 0
    assert "wrote indexed token shards (train: " in capsys.readouterr().out
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    want = [tok(text)["input_ids"] + [tok.eos_token_id] for text in DOCS]
    split = [is_validation(i, 0.25, 3) for i in range(len(DOCS))]
    for name, in_split in (("train", False), ("validation", True)):
        stream = TokenStream(tmp_path / "data" / name)
        docs = [stream.shards[i].tokens[a:b].tolist() for i in range(len(stream.shards))
                for a, b in zip(stream.shards[i].documents.offsets[:-1], stream.shards[i].documents.offsets[1:])]
        assert docs == [d for d, v in zip(want, split) if v == in_split], name
    header = read_header(sorted((tmp_path / "data" / "train").glob("*.idx"))[0])
    assert header.tokenizer == {"name": str(tokenizer_dir), "vocabulary_sha256": vocabulary_sha256(tok.get_vocab())}
    assert header.vocab_size == len(tok) and len(list((tmp_path / "data" / "train").glob("*.idx"))) > 1


def test_an_indexed_overwrite_replaces_every_shard_of_the_earlier_pack(tmp_path, capsys):
    src = write_docs(tmp_path / "docs", DOCS)
    out = tmp_path / "data"
    assert run("--input", src, "--format", "indexed", "--output-dir", out, "--shard-tokens", 100) == 0
    many = sorted(p.name for p in (out / "train").iterdir())
    assert len(many) > 4
    assert run("--input", src, "--format", "indexed", "--output-dir", out) == 2
    assert "holds shards" in capsys.readouterr().err
    assert run("--input", src, "--format", "indexed", "--output-dir", out, "--overwrite") == 0
    assert sorted(p.name for p in (out / "train").iterdir()) == ["train-00000.bin", "train-00000.idx"]
    # a failed pack leaves the shards it would have replaced
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    assert run("--input", tmp_path / "bad.jsonl", "--format", "indexed", "--output-dir", out, "--overwrite") == 2
    assert sorted(p.name for p in (out / "train").iterdir()) == ["train-00000.bin", "train-00000.idx"]
