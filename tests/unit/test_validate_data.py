"""`smlaunch validate` against the data a job will read on this machine and the hyperparameters
smlaunch's runtime takes (launcher.config.data_rules, data_order, job_rules): each defect is a
validation error (exit 2) or warning naming the file or field, never a traceback, and never
something the job finds after its instances start."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from container.data.indexed import write_shards
from launcher.cli.app import main
from launcher.wire.token_shards import encode_header, read_header
from tests.support.cli import ROOT

BYTES = {"name": "UTF-8 bytes", "vocabulary_sha256": None}


def validate(tmp_path: Path, inputs: dict[str, Path], **hyperparameters):
    hp = {"model_preset": "llama3-tiny", "max_context_width": 8, "dataset_type": "indexed", **hyperparameters}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 1, "processes_per_host": 1, "inputs": {k: str(v) for k, v in inputs.items()},
           "hyperparameters": hp}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    result = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
    return result.exit_code, " ".join(result.stderr.split())  # the terminal's line breaks aside


def shards(directory: Path, docs=((1, 2, 3, 4),) * 10, shard_tokens: int = 1 << 30) -> Path:
    write_shards(docs, directory, directory.name, vocab_size=256, tokenizer=BYTES, shard_tokens=shard_tokens)
    return directory


# --- indexed token shards ------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("tokens", "12893"), ("documents", "3"), ("max_token_id", "5"), ("tokenizer", "bytes"), ("documents", -1),
])
def test_a_shard_header_of_the_wrong_type_is_a_validation_error(tmp_path, field, value):
    train = shards(tmp_path / "train")
    assert validate(tmp_path, {"train": train})[0] == 0  # the control
    idx = train / "train-00000.idx"
    header = read_header(idx)
    fields = {**header.fields, field: value}
    # documents -1 with no offsets: the index's size agrees with its header, as in the issue
    idx.write_bytes(encode_header(fields) + (b"" if value == -1 else idx.read_bytes()[header.offsets_at:]))
    code, errors = validate(tmp_path, {"train": train})
    assert code == 2, errors
    assert f"train-00000.idx: the index header's field '{field}' is {json.dumps(value)}" in errors
    assert "pack the data again (python -m container.data pack --format indexed)" in errors


def test_tokens_without_their_index_are_a_validation_error(tmp_path):
    train = shards(tmp_path / "train", shard_tokens=20)
    assert validate(tmp_path, {"train": train})[0] == 0  # the control: both shards whole
    (train / "train-00001.idx").unlink()
    code, errors = validate(tmp_path, {"train": train})
    assert code == 2 and "train-00001.bin: no index: train-00001.idx is missing beside it" in errors, errors


# --- data_mixture -----------------------------------------------------------------------------------

def test_a_mixture_whose_channel_gets_no_sample_is_a_validation_error(tmp_path):
    inputs = {name: shards(tmp_path / name) for name in ("train", "web")}
    code, errors = validate(tmp_path, inputs, data_mixture="train:1,web:0.001")  # the control: 1 sample a round
    assert code == 0, errors
    code, errors = validate(tmp_path, inputs, data_mixture="train:1,web:0.0001")
    assert code == 2, errors
    assert "hyperparameters.data_mixture" in errors and "the weight of web, 0.0001" in errors
    assert "less than 1/1000: it would get no sample in a round of 1000" in errors


def test_a_mixture_of_weights_near_the_float_maximum_is_shared_by_their_ratio(tmp_path):
    """1e308 + 1.5e308 overflows a float: before, every share was 0 (train:0,web:0)."""
    inputs = {name: shards(tmp_path / name) for name in ("train", "web")}
    for mixture in ("train:2,web:3", "train:1e308,web:1.5e308"):  # the control, and the same ratio near the maximum
        assert validate(tmp_path, inputs, data_mixture=mixture)[0] == 0
        result = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml")])
        assert "indexed, shuffled with seed 12345, mixture train:0.4,web:0.6" in result.stdout, result.stdout


def test_the_container_refuses_a_mixture_validate_would_refuse():
    """A job built by hand skips validate: its malformed mixture used to be dropped by the run
    settings, and the job trained on the train channel alone."""
    from container.args import parse_args
    from container.trainer import refuse_unimplemented
    refuse_unimplemented(parse_args(["--model_preset", "llama3-tiny", "--data_mixture", "train:1,web:0.001"])[0])
    for mixture, words in (("web=0.7", r"'web=0.7' is not channel:weight"),
                           ("train:1,web:0.0001", r"the weight of web, 0.0001, .* less than 1/1000")):
        hp = parse_args(["--model_preset", "llama3-tiny", "--data_mixture", mixture])[0]
        with pytest.raises(ValueError, match=rf"hyperparameters.data_mixture = \"{re.escape(mixture)}\": {words}"):
            refuse_unimplemented(hp)


# --- chat channels --------------------------------------------------------------------------------

USER, ANSWER = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}


def chat_lines(directory: Path, records) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


@pytest.mark.parametrize(("bad", "words"), [
    ({"messages": [USER]}, "a.jsonl:37: messages has no assistant turn"),
    ({"messages": [{"role": "tool", "content": "{}"}, ANSWER]}, "a.jsonl:37: messages[0].role is 'tool'"),
    ({"prompt": "a"}, "a.jsonl:37: has prompt but no completion"),
])
def test_every_record_of_a_local_chat_channel_is_checked_and_named_in_the_users_file(tmp_path, bad, words):
    """The job checks every record after its instances start; validate does it first, naming the
    user's file (the job's is a copy in its job directory)."""
    hp = {"dataset_type": "chat", "max_context_width": 64, "tokenizer": "org/tokenizer"}
    good = chat_lines(tmp_path / "good", [{"messages": [USER, ANSWER]}] * 60)
    assert validate(tmp_path, {"train": good}, **hp)[0] == 0  # the control
    records = [{"messages": [USER, ANSWER]}] * 36 + [bad] + [{"messages": [USER, ANSWER]}] * 20 + [bad]
    channel = chat_lines(tmp_path / "user data", records)
    code, errors = validate(tmp_path, {"train": channel}, **hp)
    assert code == 2, errors
    assert "inputs.train = " in errors  # its value cut at 80 characters (issues.show_value)
    assert f": {channel / words}" in errors
    assert "(2 of its 58 records fail; the first is shown)" in errors


# --- the tokenizer against the model --------------------------------------------------------------

@pytest.mark.usefixtures("no_network")
def test_a_tokenizer_with_more_tokens_than_the_models_vocabulary_is_a_validation_error(tmp_path):
    from tests.support.hf_models import save_chat_tokenizer

    tokenizer = tmp_path / "tokenizer"
    size = len(save_chat_tokenizer(tokenizer))  # 312 + 3 chat tokens, more than llama3-tiny's 256
    channel = chat_lines(tmp_path / "chat", [{"messages": [USER, ANSWER]}])
    hp = {"dataset_type": "chat", "max_context_width": 64, "tokenizer": str(tokenizer)}
    assert validate(tmp_path, {"train": channel}, **hp, vocab_size=size)[0] == 0  # the control: it fits
    code, errors = validate(tmp_path, {"train": channel}, **hp)
    assert code == 2, errors
    assert "hyperparameters.tokenizer = " in errors  # its value cut at 80 characters (issues.show_value)
    assert f": its tokenizer ({tokenizer / 'tokenizer.json'}) has {size} tokens" in errors
    assert "more than llama3-tiny's vocabulary of 256" in errors and f"vocab_size: {size} or more" in errors


# --- a JSON Lines token channel ---------------------------------------------------------------------

@pytest.mark.parametrize("record", [{"messages": [USER, ANSWER]}, {"prompt": "a", "completion": "b", "id": 3}])
def test_chat_records_in_a_json_lines_channel_are_a_validation_error_that_names_dataset_type_chat(tmp_path, record):
    hp = {"dataset_type": "jsonl", "max_context_width": 4}
    tokens = chat_lines(tmp_path / "tokens", [{"input_ids": [1, 2, 3, 4]}])
    assert validate(tmp_path, {"train": tokens}, **hp)[0] == 0  # the control
    channel = chat_lines(tmp_path / "chat", [record])
    code, errors = validate(tmp_path, {"train": channel}, **hp)
    assert code == 2, errors
    assert "inputs.train = " in errors  # its value cut at 80 characters (issues.show_value)
    assert f": {channel / 'a.jsonl'}:1: field '{next(iter(record))}' changes how the " \
           "record trains and is not read; chat and instruction records are tokenized" in errors
    assert "set dataset_type: chat (docs/data.md)" in errors
