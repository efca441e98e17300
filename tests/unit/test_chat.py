"""Chat and instruction fine-tuning's data, in process (dataset_type chat; docs/data.md): which tokens
are trained (by hand, against TRL's definition computed here with transformers' apply_chat_template,
and against transformers' own assistant mask), best-fit packing into rows of documents, truncation,
the order of rows, every error naming its record, and what `smlaunch validate` checks. Training
through train.py, the loss against transformers' and the exported artifact:
tests/integration/test_chat_finetune.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from container.data.chat import ChatError, Example, load_tokenizer
from container.data.chat_source import ChatSource, best_fit_decreasing, truncate
from container.data.loader import build_dataloader, build_validation_loader
from container.data.order import Permutation
from container.data.rows import IGNORE_INDEX
from launcher.config import TrainingHyperparameters
from launcher.wire.chat_records import ChatRecordError, has_chat_template, record_shape
from launcher.wire.training.resume import data_stream
from launcher.wire.training.run_settings import run_settings
from tests.support.hf_models import VOCAB, save_chat_tokenizer

transformers = pytest.importorskip("transformers")

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hi there"}
ANSWER = {"role": "assistant", "content": "Hello."}
AGAIN = {"role": "user", "content": "Again"}
SECOND = {"role": "assistant", "content": "Yes"}
CONVERSATION = [SYSTEM, USER, ANSWER, AGAIN, SECOND]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("chat-tokenizer")
    save_chat_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def chat(tokenizer_dir):
    return load_tokenizer(tokenizer_dir, "tiny-chat")


@pytest.fixture(scope="module")
def hf(tokenizer_dir):
    """The same tokenizer, loaded by the test itself: the reference's."""
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


def render(hf, messages, generation_prompt=False) -> list[int]:
    return list(hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                       return_dict=False))


def trained_text(hf, example: Example) -> list[str]:
    """The trained tokens as text, one string per run of consecutive trained tokens."""
    runs, current = [], []
    for token, label in zip(example.input_ids, example.labels):
        if label != IGNORE_INDEX:
            assert label == token  # labels are the tokens themselves, before the shift
            current.append(token)
        elif current:
            runs.append(hf.decode(current))
            current = []
    if current:
        runs.append(hf.decode(current))
    return runs


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --- which tokens train -------------------------------------------------------------------------

def test_every_assistant_turn_is_trained_and_nothing_else(chat, hf):
    example = chat.example({"messages": CONVERSATION}, "t.jsonl:1")
    assert example.input_ids == render(hf, CONVERSATION)
    # by hand: each answer's content and its end-of-turn token; not the system or user turns, not
    # the assistant header (the generation prompt, which the prompt side already ends with)
    assert trained_text(hf, example) == ["Hello.<|eot_id|>", "Yes<|eot_id|>"]
    # transformers' own assistant mask of the template's {% generation %} blocks: the same tokens
    mask = hf.apply_chat_template(CONVERSATION, return_dict=True, return_assistant_tokens_mask=True)["assistant_masks"]
    assert [label != IGNORE_INDEX for label in example.labels] == [bool(m) for m in mask]


def test_the_trained_tokens_are_trls_completion_of_each_turn(chat, hf):
    """TRL's definition, computed here: what the template of the conversation up to turn i adds
    after the template of the turns before it with the generation prompt."""
    example = chat.example({"messages": CONVERSATION}, "t.jsonl:1")
    expected = [IGNORE_INDEX] * len(example.input_ids)
    for i, message in enumerate(CONVERSATION):
        if message["role"] == "assistant":
            prompt, full = render(hf, CONVERSATION[:i], True), render(hf, CONVERSATION[:i + 1])
            assert full[:len(prompt)] == prompt
            expected[len(prompt):len(full)] = full[len(prompt):]
    assert example.labels == expected
    # the control: a scheme that trains each answer after the turns before it *without* the
    # generation prompt (the assistant header trained too) is another labelling, which this test sees
    header_too = [IGNORE_INDEX] * len(example.input_ids)
    for i, message in enumerate(CONVERSATION):
        if message["role"] == "assistant":
            start, end = len(render(hf, CONVERSATION[:i])), len(render(hf, CONVERSATION[:i + 1]))
            header_too[start:end] = example.input_ids[start:end]
    assert header_too != expected
    assert sum(label != IGNORE_INDEX for label in header_too) > sum(label != IGNORE_INDEX for label in expected)


def test_a_conversational_prompt_completion_trains_the_completion(chat, hf):
    prompt, completion = [SYSTEM, USER], [ANSWER]
    example = chat.example({"prompt": prompt, "completion": completion}, "t.jsonl:1")
    before, full = render(hf, prompt, True), render(hf, prompt + completion)  # TRL's SFTTrainer
    assert example.input_ids == full
    assert example.labels == [IGNORE_INDEX] * len(before) + full[len(before):]
    assert trained_text(hf, example) == ["Hello.<|eot_id|>"]


def test_a_plain_text_prompt_completion_is_prompt_then_completion_then_eos(chat, hf):
    example = chat.example({"prompt": "The model", "completion": " learns."}, "t.jsonl:1")
    prompt = hf("The model")["input_ids"]
    completion = hf(" learns.", add_special_tokens=False)["input_ids"]
    assert prompt[0] == hf.bos_token_id  # the tokenizer's own special tokens on the prompt
    assert example.input_ids == prompt + completion + [hf.eos_token_id]
    assert example.labels == [IGNORE_INDEX] * len(prompt) + completion + [hf.eos_token_id]
    # no template is applied: a tokenizer without one tokenizes the same
    # and a completion that ends with the EOS gets no second one (TRL's add_eos)
    ending = chat.example({"prompt": "The model", "completion": " learns.</s>"}, "t.jsonl:2")
    assert ending.input_ids == example.input_ids


def test_a_template_that_renders_earlier_turns_differently_is_an_error_naming_the_record(tmp_path):
    # the last message is rendered with a marker the same turn loses once another follows (as
    # templates that strip earlier turns' reasoning do): the answer's tokens would be misplaced
    shifting = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                "{{ m['content'] }}{% if loop.last %} (last){% endif %}<|eot_id|>{% endfor %}"
                "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
    save_chat_tokenizer(tmp_path / "tok", shifting)
    chat = load_tokenizer(tmp_path / "tok", "shifting")
    with pytest.raises(ChatError, match=r"t.jsonl:3: the chat template of shifting renders earlier turns "
                                        r"differently once later turns follow: messages\[:1\] with the generation"):
        chat.example({"messages": [USER, ANSWER]}, "t.jsonl:3")
    # the control: the consistent template takes the same record
    save_chat_tokenizer(tmp_path / "good")
    load_tokenizer(tmp_path / "good", "good").example({"messages": [USER, ANSWER]}, "t.jsonl:3")


# --- record errors, each naming its record ------------------------------------------------------

@pytest.mark.parametrize(("record", "message"), [
    ({"messages": [SYSTEM, USER]}, r"t.jsonl:7: messages has no assistant turn"),
    ({"messages": [USER, {"role": "robot", "content": "x"}]}, r"t.jsonl:7: messages\[1\].role is \"robot\", an"),
    ({"messages": [USER, {"role": "tool", "content": "x"}, ANSWER]}, r"t.jsonl:7: messages\[1\].role is 'tool': turns"),
    ({"messages": [USER, {"role": "assistant", "content": [{"type": "text", "text": "x"}]}]},
     r"t.jsonl:7: messages\[1\].content is list, not a string"),
    ({"messages": [USER, {**ANSWER, "weight": 0}]}, r"t.jsonl:7: messages\[1\] has field\(s\) 'weight', which are"),
    ({"messages": [ANSWER, USER]}, r"t.jsonl:7: messages\[0\] is an assistant turn: it answers nothing"),
    ({"messages": []}, r"t.jsonl:7: messages must be a non-empty list"),
    ({"prompt": "Q", "completion": ""}, r"t.jsonl:7: completion is empty"),
    ({"prompt": "Q"}, r"t.jsonl:7: has prompt but no completion"),
    ({"prompt": "Q", "completion": [ANSWER]}, r"t.jsonl:7: prompt is str and completion list"),
    ({"prompt": [USER], "completion": [USER]}, r"t.jsonl:7: completion has no assistant turn"),
    ({"messages": [USER, ANSWER], "prompt": "Q", "completion": "A"}, r"t.jsonl:7: has messages and prompt"),
    ({"conversations": [{"from": "human", "value": "x"}]}, r"t.jsonl:7: field 'conversations' changes how"),
    ({"messages": [USER, ANSWER], "completion_mask": [1]}, r"t.jsonl:7: field 'completion_mask' changes how"),
    ({"text": "plain"}, r"t.jsonl:7: neither messages nor prompt/completion \(this record's fields: 'text'\)"),
    ([1, 2], r"t.jsonl:7: expected a JSON object"),
])
def test_a_record_that_is_no_example_is_an_error_naming_it(chat, record, message):
    with pytest.raises(ChatRecordError, match=message):
        chat.example(record, "t.jsonl:7")


def test_a_tokenizer_without_a_chat_template_is_an_error_naming_it_and_the_record(tmp_path, chat):
    save_chat_tokenizer(tmp_path / "plain", template=None)
    plain = load_tokenizer(tmp_path / "plain", "plain-tok")
    with pytest.raises(ChatError, match=r"t.jsonl:2: a messages example needs a chat template, and the tokenizer "
                                        r"of plain-tok has none"):
        plain.example({"messages": [USER, ANSWER]}, "t.jsonl:2")
    with pytest.raises(ChatError, match=r"t.jsonl:2: a prompt-completion \(messages\) example needs a chat template"):
        plain.example({"prompt": [USER], "completion": [ANSWER]}, "t.jsonl:2")
    # plain-text prompt-completion needs none, and tokenizes as with the template
    text = {"prompt": "The model", "completion": " learns."}
    assert plain.example(text, "t.jsonl:3") == chat.example(text, "t.jsonl:3")
    assert has_chat_template(tmp_path / "plain") is False


def test_the_error_from_a_channel_names_the_file_and_line(tmp_path, chat):
    path = write_jsonl(tmp_path / "train" / "a.jsonl", [{"messages": [USER, ANSWER]}, {"messages": [USER]}])
    with pytest.raises(ChatRecordError, match=rf"{path}:2: messages has no assistant turn"):
        ChatSource([path], chat, 64, VOCAB, seed=0, shuffle=False)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"messages": [USER, ANSWER]}], indent=1))
    with pytest.raises(ChatRecordError, match=rf"{bad}:1: not JSON .*not one JSON array"):
        ChatSource([bad], chat, 64, VOCAB, seed=0, shuffle=False)


def test_token_ids_outside_the_models_vocabulary_are_an_error(tmp_path, chat):
    path = write_jsonl(tmp_path / "a.jsonl", [{"messages": [USER, ANSWER]}])
    with pytest.raises(ChatError, match=rf"{path}:1: the tokenizer of tiny-chat gives token id \d+, outside the "
                                        r"model's vocabulary \[0, 300\)"):
        ChatSource([path], chat, 64, 300, seed=0, shuffle=False)


# --- packing ------------------------------------------------------------------------------------

def test_best_fit_decreasing_by_hand():
    # 6 opens a row, 5 another; 4 fits only the first (room 4), 3 and 2 the second's room 5 exactly
    assert best_fit_decreasing([3, 6, 4, 5, 2], 10) == [[1, 2], [3, 0, 4]]
    # ties go by index, so the bins are the same on every rank
    assert best_fit_decreasing([2, 2, 2], 4) == [[0, 1], [2]]


@pytest.mark.parametrize("seed", range(5))
def test_best_fit_decreasing_never_splits_or_overfills(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 64) for _ in range(300)]
    bins = best_fit_decreasing(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(300))  # each item once, whole
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    # best fit: no two bins could be merged, and the bins are near the bound
    loads = sorted(sum(lengths[i] for i in b) for b in bins)
    assert loads[0] + loads[1] > 64
    assert len(bins) <= -(-sum(lengths) // 64) * 11 // 9 + 1  # BFD's 11/9 OPT + 6/9 bound, loosely


def examples(chat, count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = ["Long", "documents", "are", "cut", "into", "blocks", "the", "model", "learns"]
    out = []
    for i in range(count):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
        answer = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
        out.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
                    "id": i})
    return out


def test_the_log_says_how_many_epochs_the_rows_make(tmp_path, chat):
    """A chat job's log says how many passes over its rows max_steps makes (issue 38, item 8)."""
    path = write_jsonl(tmp_path / "train" / "a.jsonl", examples(chat, 40))
    source = ChatSource([path], chat, 96, VOCAB, seed=0, shuffle=False)
    n = len(source.rows)
    assert n > 4  # the rows the examples fill, counted by the source itself
    assert source.epochs(n, 2) == (f"{n:,} step(s) of 2 rows read {2 * n:,} rows: 2 epoch(s) of the {n:,} rows of "
                                   f"chat examples of {source.name}")
    assert source.epochs(1, n // 4 * 2).split(": ")[1].startswith(f"{n // 4 * 2 / n:.3g} epoch(s)")  # under one


def test_examples_are_packed_whole_each_its_own_document(tmp_path, chat, hf):
    records = examples(chat, 40)
    path = write_jsonl(tmp_path / "train" / "a.jsonl", records)
    source = ChatSource([path], chat, 96, VOCAB, seed=0, shuffle=False)
    alone = [chat.example(r, "x") for r in records]
    found = []
    for index in range(len(source.rows)):
        batch = source.read(index, 1)
        ids, labels, positions, documents = (batch[k][0] for k in ("input_ids", "labels", "positions", "documents"))
        starts = (positions == 0).nonzero().flatten().tolist() + [96]
        assert documents.tolist() == [d for d, (a, b) in enumerate(zip(starts, starts[1:])) for _ in range(b - a)]
        for a, b in zip(starts, starts[1:]):
            piece = ids[a:b].tolist()
            match = [e for e in alone if e.input_ids == piece]
            if not match:  # the padding at the row's end: its own document, never a target
                assert b == 96 and set(piece) == {hf.pad_token_id}
                assert (labels[a:b] == IGNORE_INDEX).all()
                continue
            example = match[0]
            found.append(alone.index(example))
            # the shifted labels of the example alone; its last token predicts nothing
            assert labels[a:b].tolist() == example.labels[1:] + [IGNORE_INDEX]
            assert positions[a:b].tolist() == list(range(b - a))
    assert sorted(found) == list(range(40))  # every example once, whole
    assert source.counts.rows == len(source.rows) < 40
    assert source.ignored_fields == {"id": f"{path}:1"}


def test_truncation_modes_and_their_counts(tmp_path, chat, hf):
    long_answer = {"messages": [USER, {"role": "assistant", "content": "model learns " * 10}]}
    long_prompt = {"messages": [{"role": "user", "content": "documents " * 30}, ANSWER]}
    short = {"messages": [USER, ANSWER]}
    path = write_jsonl(tmp_path / "a.jsonl", [long_answer, long_prompt, short])
    full = chat.example(long_answer, "x")
    seq = 32
    assert len(full.input_ids) > seq and len(chat.example(long_prompt, "x").input_ids) > seq

    start = ChatSource([path], chat, seq, VOCAB, seed=0, shuffle=False, truncation_mode="keep_start")
    # the long answer keeps its first 32 tokens; the long prompt keeps nothing to train: dropped
    c = start.counts
    assert (c.examples, c.truncated, c.dropped_long, c.dropped_untrained) == (3, 1, 0, 1)
    first = truncate(full, seq, "keep_start")
    assert first.input_ids == full.input_ids[:seq] and first.labels == full.labels[:seq]
    assert "3 examples in 1 file(s)" in start.describe() and "1 truncated, 1 dropped" in start.describe()

    end = ChatSource([path], chat, seq, VOCAB, seed=0, shuffle=False, truncation_mode="keep_end")
    c = end.counts
    assert (c.truncated, c.dropped_long, c.dropped_untrained) == (2, 0, 0)  # both keep their answers' end
    last = truncate(full, seq, "keep_end")
    assert last.input_ids == full.input_ids[-seq:] and last.labels == full.labels[-seq:]

    drop = ChatSource([path], chat, seq, VOCAB, seed=0, shuffle=False, truncation_mode="drop")
    c = drop.counts
    assert (c.truncated, c.dropped_long, c.dropped_untrained, c.rows) == (0, 2, 0, 1)
    assert c.tokens == len(chat.example(short, "x").input_ids)
    assert c.padding == seq - c.tokens and drop.padding_share == pytest.approx(c.padding / seq)

    with pytest.raises(ValueError, match=r"no chat example of .* fits a row of max_context_width=8"):
        ChatSource([path], chat, 8, VOCAB, seed=0, shuffle=False, truncation_mode="drop")


# --- order, loaders, formats --------------------------------------------------------------------

def loader(path, tokenizer, **options):
    return build_dataloader(dataset_type="chat", path=path, seq_len=64, micro_batch_size=2, dp_rank=0, dp_size=1,
                            vocab_size=VOCAB, tokenizer=tokenizer, **options)


def test_rows_are_read_in_order_or_shuffled_per_epoch(tmp_path, chat):
    path = write_jsonl(tmp_path / "train" / "a.jsonl", examples(chat, 60))
    source = ChatSource([path], chat, 64, VOCAB, seed=0, shuffle=False)
    n = len(source.rows)
    rows = torch.stack([source.read(i, 1)["input_ids"][0] for i in range(n)])
    in_order = loader(path, chat, shuffle=False)
    got = torch.cat([in_order.next_batch()["input_ids"] for _ in range(n)])  # two epochs
    assert torch.equal(got[:n], rows) and torch.equal(got[n:2 * n], rows)  # sample i is row i mod N
    shuffled = loader(path, chat, shuffle=True, seed=5)
    got = torch.cat([shuffled.next_batch()["input_ids"] for _ in range(n)])
    for epoch in (0, 1):
        order = Permutation(n, seed=5, epoch=epoch)(range(n))
        assert torch.equal(got[epoch * n:(epoch + 1) * n], rows[torch.from_numpy(order)])
    assert not torch.equal(got[:n], rows) and not torch.equal(got[:n], got[n:2 * n])
    # every rank packs the same rows (a second source, as another rank builds it)
    again = ChatSource([path], chat, 64, VOCAB, seed=0, shuffle=False)
    assert again.rows == source.rows


def test_validation_reads_the_rows_in_order_once(tmp_path, chat):
    path = write_jsonl(tmp_path / "validation" / "v.jsonl", examples(chat, 30, seed=1))
    source = ChatSource([path], chat, 64, VOCAB, seed=0, shuffle=False, repeat=False)
    batches = list(build_validation_loader(dataset_type="chat", path=path.parent, seq_len=64, micro_batch_size=1,
                                           dp_rank=0, dp_size=1, vocab_size=VOCAB, tokenizer=chat))
    assert len(batches) == len(source.rows)
    assert all(torch.equal(b["input_ids"][0], source.read(i, 1)["input_ids"][0]) for i, b in enumerate(batches))


def test_parquet_and_json_lines_give_the_same_rows(tmp_path, chat):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    records = examples(chat, 20) + [{"prompt": "The model", "completion": " learns."}]
    jsonl = write_jsonl(tmp_path / "jsonl" / "a.jsonl", records)
    (tmp_path / "parquet").mkdir()
    columns = {name: pa.array([r.get(name) for r in records]) for name in ("messages", "prompt", "completion", "id")}
    pq.write_table(pa.Table.from_pydict(columns), tmp_path / "parquet" / "a.parquet")  # nulls where fields lack
    ours = loader(jsonl.parent, chat, shuffle=False).source
    theirs = loader(tmp_path / "parquet", chat, shuffle=False).source
    assert theirs.rows == ours.rows and (theirs.tokens == ours.tokens).all() and (theirs.labels == ours.labels).all()
    pq.write_table(pa.Table.from_pylist([{"messages": [USER]}]), tmp_path / "bad.parquet")
    with pytest.raises(ChatRecordError, match=r"bad.parquet row 0: messages has no assistant turn"):
        ChatSource([tmp_path / "bad.parquet"], chat, 64, VOCAB, seed=0, shuffle=False)
    cut = tmp_path / "cut.parquet"  # a file cut short (a copy that stopped): its error, not pyarrow's traceback
    cut.write_bytes((tmp_path / "parquet" / "a.parquet").read_bytes()[:200])
    with pytest.raises(ChatRecordError, match=r"cut.parquet: not a readable Parquet file"):
        ChatSource([cut], chat, 64, VOCAB, seed=0, shuffle=False)


def test_chat_needs_a_tokenizer(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"messages": [USER, ANSWER]}])
    with pytest.raises(ValueError, match="dataset_type chat needs the model's tokenizer: set "
                                         "hf_pretrained_model_name_or_dir or tokenizer"):
        loader(path, None)


@pytest.mark.parametrize("record", [{"input_ids": [1, 2, 3, 4], "messages": [USER, ANSWER]},
                                    {"messages": [USER, ANSWER]}, {"prompt": "a", "completion": "b"}])
def test_a_json_lines_token_channel_refuses_chat_records_and_names_the_fix(tmp_path, record):
    """docs/data.md promises the error says to set dataset_type: chat, also for a chat record
    without input_ids (which used to fail as 'expected ... an integer list input_ids')."""
    def first_batch(path):
        return build_dataloader(dataset_type="jsonl", path=path, seq_len=4, micro_batch_size=1, dp_rank=0,
                                dp_size=1, vocab_size=VOCAB).next_batch()

    assert first_batch(write_jsonl(tmp_path / "ok.jsonl", [{"input_ids": [1, 2, 3, 4]}]))["input_ids"].shape == (1, 4)
    path = write_jsonl(tmp_path / "a.jsonl", [record])
    with pytest.raises(ValueError, match="a.jsonl:1: field '(messages|prompt)' changes how the record trains .* set "
                                         "dataset_type: chat"):
        first_batch(path)


def test_shapes_of_records():
    assert record_shape({"messages": [USER, ANSWER], "source": "x"}, "w") == "messages"
    assert record_shape({"prompt": [USER], "completion": [ANSWER]}, "w") == "prompt-completion (messages)"
    assert record_shape({"prompt": "a", "completion": "b"}, "w") == "prompt-completion (text)"


# --- settings and validate ----------------------------------------------------------------------

def settings(**hyperparameters):
    return run_settings(TrainingHyperparameters(**hyperparameters), None, 1)


def test_chat_is_shuffled_by_default_and_the_stream_names_seed_and_truncation():
    s = settings(dataset_type="chat", seed=7)
    assert s.shuffle and s.truncation_mode == "keep_start"
    assert data_stream(s) == "chat, shuffled with seed 7, truncation_mode keep_start"
    assert data_stream(settings(dataset_type="chat", shuffle=0, truncation_mode="drop")) == \
        "chat, in order, truncation_mode drop"
    assert not settings(dataset_type="jsonl").shuffle  # the control: JSON Lines stay in order


def run_validate(tmp_path: Path, train: Path, **hyperparameters):
    from click.testing import CliRunner

    from launcher.cli.app import main
    from tests.support.cli import ROOT

    # llama3-tiny with the tiny tokenizer's vocabulary (VOCAB: 315 tokens with the chat ones)
    hp = {"model_preset": "llama3-tiny", "vocab_size": VOCAB, "max_context_width": 64, "dataset_type": "chat",
          **hyperparameters}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 1, "processes_per_host": 1, "inputs": {"train": str(train)}, "hyperparameters": hp}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    return CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)


@pytest.mark.usefixtures("no_network")
def test_validate_checks_a_local_chat_channel(tmp_path, tokenizer_dir):
    good = write_jsonl(tmp_path / "good" / "a.jsonl", [{"messages": [USER, ANSWER]}]).parent
    result = run_validate(tmp_path, good, tokenizer=str(tokenizer_dir))
    assert result.exit_code == 0, result.output
    assert "chat, shuffled with seed 12345, truncation_mode keep_start" in result.output
    # no tokenizer named
    result = run_validate(tmp_path, good)
    assert result.exit_code == 2 and "dataset_type chat needs the model's tokenizer" in result.stderr, result.output
    # the first record is no example
    bad = write_jsonl(tmp_path / "bad" / "a.jsonl", [{"messages": [USER]}]).parent
    result = run_validate(tmp_path, bad, tokenizer=str(tokenizer_dir))
    assert result.exit_code == 2 and "a.jsonl:1: messages has no assistant turn" in result.stderr, result.output
    # a local tokenizer without a chat template, for messages; plain-text records need none
    save_chat_tokenizer(tmp_path / "plain", template=None)
    result = run_validate(tmp_path, good, tokenizer=str(tmp_path / "plain"))
    assert result.exit_code == 2 and "has none (no chat_template in tokenizer_config.json" in \
        " ".join(result.stderr.split()), result.output
    text = write_jsonl(tmp_path / "text" / "a.jsonl", [{"prompt": "a", "completion": "b"}]).parent
    assert run_validate(tmp_path, text, tokenizer=str(tmp_path / "plain")).exit_code == 0
    # truncation_mode is for chat data
    result = run_validate(tmp_path, good, tokenizer=str(tokenizer_dir), dataset_type="synthetic",
                          truncation_mode="drop")
    assert result.exit_code == 2 and "hyperparameters.truncation_mode" in result.stderr, result.output
