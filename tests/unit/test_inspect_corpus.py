"""`python -m container.data inspect` on smlaunch's own shards (container.data.inspect_corpus; a
Megatron-Core corpus: tests/unit/test_megatron_corpus.py): the header's facts, the documents'
token ids as they were written, and one-line errors with exit code 2."""

from __future__ import annotations

import json

from container.data.indexed import write_shards
from container.data.inspect_corpus import main as inspect
from tests.support.pack import DOCS as TEXTS
from tests.support.pack import run, write_docs

BYTES = {"name": "UTF-8 bytes", "vocabulary_sha256": None}
DOCS = [[1, 2, 3], [], [4, 5, 6, 7, 8], list(range(100, 140))]


def test_inspect_shows_a_shards_header_lengths_and_documents(tmp_path, capsys):
    write_shards(DOCS * 3, tmp_path / "train", "train", vocab_size=256, tokenizer=BYTES, shard_tokens=60)
    assert inspect([str(tmp_path / "train")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{tmp_path / 'train'}: 3 file(s), 12 documents, 144 tokens\n")
    # 60 tokens a shard at most: the first seven documents (56 tokens), the next four, the last
    assert ("  train-00000.idx: smlaunch indexed tokens v1, uint16, 7 documents, 56 tokens; tokenizer UTF-8 bytes "
            "(vocab_size 256, largest id 139)") in out
    assert "[32, 64)" in out and "[0, 2)" in out  # the 40-token and the empty documents' buckets
    assert inspect([str(tmp_path / "train"), "--documents", "2:6", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"document": i, "input_ids": (DOCS * 3)[i]} for i in range(2, 6)]


def test_inspect_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert inspect([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip().endswith("missing: no such file or directory")
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "web.idx").write_bytes(b"not an index")
    assert inspect([str(tmp_path / "train")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "web.idx: not an indexed token shard" in err[0], err


def test_inspect_reads_json_lines_records_as_the_job_cuts_their_documents(tmp_path, capsys):
    records = [{"input_ids": [1, 2, 3, 4], "position_ids": [0, 1, 0, 1]},  # two documents
               {"input_ids": [5, 6, 7, 8], "position_ids": [2, 3, 4, 0], "text": "metadata"},  # one goes on
               {"input_ids": [9, 10, 11, 300]}]  # no position_ids: one sequence
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    (tmp_path / "train" / "b.jsonl").write_text(json.dumps(records[2]) + "\n\n")
    want = [[1, 2], [3, 4], [5, 6, 7], [8], [9, 10, 11, 300]]
    assert inspect([str(tmp_path / "train"), "--documents", "1:", "--json"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"document": i, "input_ids": ids} for i, ids in enumerate(want) if i >= 1]
    assert inspect([str(tmp_path / "train"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(f["file"], f["records"], f["documents"], f["tokens"], f["max_token_id"]) for f in report["files"]] == [
        ("a.jsonl", 2, 4, 8, 8), ("b.jsonl", 1, 1, 4, 300)]
    assert report["lengths"] == {"0": [1, 1], "1": [3, 7], "2": [1, 4]}  # 1; 2, 2 and 3; 4 tokens
    (tmp_path / "train" / "b.jsonl").write_text('{"messages": []}\n')
    assert inspect([str(tmp_path / "train")]) == 2
    assert "b.jsonl:1: not a token record (no list 'input_ids')" in capsys.readouterr().err


def test_decode_prints_each_documents_text(tmp_path, capsys, tokenizer_dir):
    texts = ["héllo wörld", "", "🦙 llamas"]
    write_shards([list(t.encode()) for t in texts], tmp_path / "bytes", "train", vocab_size=256, tokenizer=BYTES)
    assert inspect([str(tmp_path / "bytes"), "--documents", "0:3", "--decode", "bytes"]) == 0
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == texts
    assert run("--input", write_docs(tmp_path / "docs", TEXTS[:3]), "--tokenizer", tokenizer_dir, "--format",
               "indexed", "--output-dir", tmp_path / "bpe") == 0
    capsys.readouterr()
    assert inspect([str(tmp_path / "bpe" / "train"), "--documents", "0:3", "--decode", str(tokenizer_dir)]) == 0
    # the tokenizer's post-processor starts every document with <s>
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == ["<s>" + t for t in TEXTS[:3]]
    assert inspect([str(tmp_path / "bpe" / "train"), "--documents", "0:1", "--decode", "bytes"]) == 2  # ids past 255
    assert "--decode bytes: id " in capsys.readouterr().err
    write_shards([[5, 6, 299], [5, 300]], tmp_path / "wide", "train", vocab_size=400, tokenizer=BYTES)
    assert inspect([str(tmp_path / "wide"), "--documents", "0:2", "--decode", str(tokenizer_dir)]) == 2
    assert "id 300 is outside its 300 ids; name the corpus's tokenizer" in capsys.readouterr().err
