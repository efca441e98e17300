"""`python -m container.data inspect` on smlaunch's own shards (container.data.inspect_corpus; a
Megatron-Core corpus: tests/unit/test_megatron_corpus.py): the header's facts, the documents'
token ids as they were written, and one-line errors with exit code 2; chat records
(container.data.inspect_chat) tokenized as transformers' chat template gives them, counted as the
job's ChatSource counts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from container.data.chat import load_tokenizer as load_chat_tokenizer
from container.data.chat_source import ChatSource
from container.data.indexed import write_shards
from container.data.inspect_corpus import main as inspect
from container.data.loader import build_dataloader
from launcher.wire.chat_records import chat_files
from tests.support.hf_models import VOCAB, save_chat_tokenizer
from tests.support.pack import DOCS as TEXTS
from tests.support.pack import run, write_docs

transformers = pytest.importorskip("transformers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

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


# --- chat records: tokenized with --tokenizer as the job tokenizes them --------------------------

QUESTIONS = ["Hi there", "Long documents are cut into blocks", "Again", "the model learns the model learns"]
ANSWERS = ["Hello.", "Yes", "Blocks are cut the model learns the model learns", "No"]


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("chat-tokenizer")
    save_chat_tokenizer(directory)
    return directory


def conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": QUESTIONS[i]}, {"role": "assistant", "content": ANSWERS[i]}]


def reference(tokenizer_dir: Path, i: int) -> tuple[list[int], list[int]]:
    """Example i's tokens and labels by transformers' own apply_chat_template (TRL's completion:
    what the answer adds after the prompt with its generation prompt)."""
    hf = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    full = list(hf.apply_chat_template(conversation(i), tokenize=True, return_dict=False))
    prompt = list(hf.apply_chat_template(conversation(i)[:1], tokenize=True, add_generation_prompt=True,
                                         return_dict=False))
    return full, [-100] * len(prompt) + full[len(prompt):]


def chat_channel(path: Path) -> Path:
    """Examples 0-1 in JSON Lines, 2-3 in Parquet (a job reads both, in sorted name order)."""
    path.mkdir()
    (path / "a.jsonl").write_text("".join(json.dumps({"messages": conversation(i), "id": i}) + "\n" for i in (0, 1)))
    pq.write_table(pa.Table.from_pylist([{"messages": conversation(i)} for i in (2, 3)]), path / "b.parquet")
    return path


def test_inspect_tokenizes_chat_records_as_the_job_does(tmp_path, capsys, chat_tokenizer):
    channel = chat_channel(tmp_path / "chat")
    want = [reference(chat_tokenizer, i) for i in range(4)]
    assert inspect([str(channel), "--tokenizer", str(chat_tokenizer), "--documents", "1:4", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["document"], d["where"], d["input_ids"], d["labels"]) for d in lines] == [
        (1, f"{channel / 'a.jsonl'}:2", *want[1]), (2, f"{channel / 'b.parquet'} row 0", *want[2]),
        (3, f"{channel / 'b.parquet'} row 1", *want[3])]
    assert inspect([str(channel), "--tokenizer", str(chat_tokenizer), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    lengths = [len(ids) for ids, _ in want]
    trained = [sum(label != -100 for label in labels[1:]) for _, labels in want]
    assert [(f["file"], f["format"], f["records"], f["tokens"], f["trained"]) for f in report["files"]] == [
        ("a.jsonl", "chat records (JSON Lines)", 2, sum(lengths[:2]), sum(trained[:2])),
        ("b.parquet", "chat records (Parquet)", 2, sum(lengths[2:]), sum(trained[2:]))]
    assert (report["documents"], report["tokens"], report["trained"]) == (4, sum(lengths), sum(trained))
    buckets = {}
    for n in lengths:
        row = buckets.setdefault(str(n.bit_length() - 1), [0, 0])
        row[0], row[1] = row[0] + 1, row[1] + n
    assert report["lengths"] == dict(sorted(buckets.items()))
    assert "rows" not in report  # no width: nothing truncated, nothing packed


def test_inspect_truncates_and_packs_chat_records_as_the_job_logs_them(tmp_path, capsys, chat_tokenizer):
    channel = chat_channel(tmp_path / "chat")
    want = [reference(chat_tokenizer, i) for i in range(4)]
    lengths = [len(ids) for ids, _ in want]
    width = sorted(lengths)[1]  # two examples longer than a row
    # keep_start keeps an example's first `width` tokens where they hold a trained one (TRL's rule)
    kept = {"keep_start": [min(n, width) for n, (_, labels) in zip(lengths, want)
                           if any(label != -100 for label in labels[1:width])],
            "drop": [n for n in lengths if n <= width]}
    for mode in ("keep_start", "drop"):
        assert inspect([str(channel), "--tokenizer", str(chat_tokenizer), "--json", "--max-context-width",
                        str(width), "--truncation-mode", mode]) == 0
        report = json.loads(capsys.readouterr().out)
        job = ChatSource(chat_files(channel), load_chat_tokenizer(chat_tokenizer, str(chat_tokenizer)), width,
                         VOCAB, seed=0, shuffle=True, truncation_mode=mode)
        c = job.counts  # what the job log's line says (describe)
        assert (report["records"], report["tokens"], report["trained"], report["truncated"], report["dropped"],
                report["rows"], report["padding"]) == (c.examples, c.tokens, c.trained, c.truncated,
                                                       c.dropped_long + c.dropped_untrained, c.rows, c.padding)
        assert report["truncated"] + report["dropped"] == sum(n > width for n in lengths) == 2  # the control
        assert (report["documents"], report["tokens"]) == (len(kept[mode]), sum(kept[mode]))
    longest = lengths.index(max(lengths))
    assert inspect([str(channel), "--tokenizer", str(chat_tokenizer), "--max-context-width", str(width),
                    "--truncation-mode", "drop", "--documents", f"{longest}:{longest + 1}"]) == 0
    assert json.loads(capsys.readouterr().out)["dropped"].endswith(f"longer than max_context_width={width}: "
                                                                   "truncation_mode drop")


def test_inspect_asks_for_the_tokenizer_chat_records_need(tmp_path, capsys, chat_tokenizer):
    channel = chat_channel(tmp_path / "chat")
    assert inspect([str(channel)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds chat records" in err[0] and "give --tokenizer DIR_OR_HUB_ID" in err[0], err
    assert inspect([str(channel), "--tokenizer", str(tmp_path / "none")]) == 2
    assert f"--tokenizer {tmp_path / 'none'}: no such directory" in capsys.readouterr().err
    (channel / "c.jsonl").write_text(json.dumps({"messages": conversation(0)[:1]}) + "\n")
    assert inspect([str(channel), "--tokenizer", str(chat_tokenizer)]) == 2  # as the job refuses it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "c.jsonl:1: messages has no assistant turn" in err[0], err
    write_shards(DOCS, tmp_path / "train", "train", vocab_size=256, tokenizer=BYTES)
    assert inspect([str(tmp_path / "train"), "--tokenizer", str(chat_tokenizer)]) == 2  # the control: tokens already
    assert "--tokenizer applies to chat records" in capsys.readouterr().err
    assert inspect([str(tmp_path / "train"), "--max-context-width", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == sum(map(len, DOCS)) // 4


# --- the mixture a job's data_mixture makes: counted from the rows its loader reads ----------------

def test_inspect_mixture_equals_the_samples_the_jobs_loader_reads(tmp_path, capsys):
    width, samples = 8, 2_345
    # web's tokens are below 100, code's 100 and up: a row says which channel it came from
    web = [[t % 100 for t in range(i, i + 5 + i % 7)] for i in range(60)]
    code = [[100 + t % 100 for t in range(i, i + 3 + i % 4)] for i in range(20)]
    write_shards(web, tmp_path / "data" / "web", "train", vocab_size=256, tokenizer=BYTES)
    write_shards(code, tmp_path / "data" / "code", "train", vocab_size=256, tokenizer=BYTES)
    rows = {"web": sum(map(len, web)) // width, "code": sum(map(len, code)) // width}  # the documents back to back
    assert inspect([str(tmp_path / "data"), "--mixture", "web:0.7,code:0.3", "--max-context-width", str(width),
                    "--samples", str(samples), "--json"]) == 0
    report = {c["channel"]: c for c in json.loads(capsys.readouterr().out)["channels"]}
    loader = build_dataloader(dataset_type="indexed", seq_len=width, micro_batch_size=samples, dp_rank=0, dp_size=1,
                              vocab_size=256, seed=3, shuffle=True, mixture=(("web", 0.7), ("code", 0.3)),
                              channels={"web": tmp_path / "data" / "web", "code": tmp_path / "data" / "code"})
    from_code = (loader.next_batch()["input_ids"] >= 100).all(dim=1).tolist()
    read = {"web": from_code.count(False), "code": from_code.count(True)}
    first_round = {"web": from_code[:1000].count(False), "code": from_code[:1000].count(True)}
    assert {name: (c["per_1000"], c["samples"], c["rows"], c["epochs"]) for name, c in report.items()} == {
        name: (first_round[name], read[name], rows[name], read[name] / rows[name]) for name in ("web", "code")}
    assert first_round == {"web": 700, "code": 300}  # the control: the shares docs/data.md promises
    assert inspect([str(tmp_path / "data"), "--mixture", "web:0.7,code:0.3", "--max-context-width", str(width)]) == 0
    assert "  code  weight 0.3: 300 of every 1,000 samples; 300 samples of its" in capsys.readouterr().out


def test_inspect_mixture_errors_name_the_channel_and_the_fix(tmp_path, capsys):
    write_shards(DOCS, tmp_path / "data" / "web", "train", vocab_size=256, tokenizer=BYTES)
    assert inspect([str(tmp_path / "data"), "--mixture", "web:0.7,books:0.3", "--max-context-width", "4"]) == 2
    assert "names channel(s) books, and " in capsys.readouterr().err
    assert inspect([str(tmp_path / "data"), "--mixture", "web:1,web:2", "--max-context-width", "4"]) == 2
    assert "--mixture 'web:1,web:2': channel web is named twice; name each channel once" in capsys.readouterr().err
    assert inspect([str(tmp_path / "data"), "--mixture", "web:1", "--max-context-width", "1000"]) == 2
    assert "fewer than one row of max_context_width=1000" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        inspect([str(tmp_path / "data"), "--mixture", "web:1"])
    assert exit.value.code == 2 and "--mixture takes --max-context-width N" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        inspect([str(tmp_path / "data" / "web"), "--samples", "5000"])  # not silently a plain summary
    assert exit.value.code == 2 and "--samples applies with --mixture" in capsys.readouterr().err
