"""Chat fine-tuning through train.py (dataset_type chat): the first logged loss is transformers'
mean next-token loss over the completion tokens of the same examples, each run alone (the
reference: LlamaForCausalLM, labels -100 except the assistant/completion tokens, found here with
transformers' own assistant mask and TRL's prompt/full rendering); the loss over every token is
far from it (the control); two FSDP processes train like one; a tokenizer without a chat template
fails before training; the exported model keeps the tokenizer and its chat template, and
transformers chats with it. The in-process half (labels, packing, errors): tests/unit/test_chat.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.hf_models import llama_config, save_chat_tokenizer, save_sharp_llama
from tests.support.train_runs import assert_same_training, run_train, series

transformers = pytest.importorskip("transformers")
SEQ = 144  # the 12 examples (14 to 120 tokens) pack into 6 rows: 3 a rank on 2 ranks
# fp32: the packed step and the examples alone add the same products in other orders (see
# tests/integration/test_document_masking.py, whose bound and model, save_sharp_llama, this test
# shares: scaled attention makes the loss depend on what each token attends to, so packed examples
# that saw each other would move it far past REL).
REL = 1e-5

SYSTEM = {"role": "system", "content": "Be brief."}
WORDS = ["Long documents are cut into blocks.", "The model learns from every token.", "Context parallelism",
         "splits each sequence over ranks;", "the loss stays the same.", "Hi there", "Again", "Yes"]


def chat_records() -> list[dict]:
    """Multi-turn conversations, conversational and plain-text prompt-completion examples."""
    records = []
    for i in range(12):
        user, answer, again, second = (WORDS[(i + k) % len(WORDS)] for k in (0, 1, 2, 3))
        turns = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        if i % 3 == 0:
            records.append({"messages": [SYSTEM, *turns, {"role": "user", "content": again},
                                         {"role": "assistant", "content": second}], "source": "test"})
        elif i % 3 == 1:
            records.append({"prompt": turns[:1], "completion": turns[1:]})
        else:
            records.append({"prompt": user, "completion": " " + answer})
    return records


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path, int]:
    """(model dir with its chat tokenizer, train channel, rows the channel packs into)."""
    from container.data.chat import load_tokenizer
    from container.data.chat_source import ChatSource

    root = tmp_path_factory.mktemp("chat")
    save_sharp_llama(root / "model", llama_config())
    save_chat_tokenizer(root / "model")
    channel = root / "train"
    channel.mkdir()
    (channel / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat_records()))
    rows = len(ChatSource([channel / "train.jsonl"], load_tokenizer(root / "model", "m"), SEQ, 320, seed=0,
                          shuffle=False).rows)
    assert rows % 2 == 0 and rows < len(chat_records())  # packed; one global batch splits over 2 ranks
    return root / "model", channel, rows


def train(tmp: Path, setup, nproc: int, **hyperparameters) -> list[dict]:
    model, channel, rows = setup
    args = {"model_preset": "", "hf_pretrained_model_name_or_dir": str(model), "dataset_type": "chat",
            "training_dir": str(channel), "max_context_width": SEQ, "train_batch_size": rows // nproc,
            "max_steps": 1, **hyperparameters}
    return run_train(tmp, nproc, **args)


def reference_examples(model_dir: Path) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of every example, made here with transformers: labels -100 except the
    assistant turns (the template's {% generation %} mask) or the completion (TRL's definition)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    out = []
    for record in chat_records():
        if "messages" in record:
            rendered = tokenizer.apply_chat_template(record["messages"], return_dict=True,
                                                     return_assistant_tokens_mask=True)
            ids = list(rendered["input_ids"])
            labels = [t if m else -100 for t, m in zip(ids, rendered["assistant_masks"])]
        elif isinstance(record["prompt"], list):
            prompt = tokenizer.apply_chat_template(record["prompt"], add_generation_prompt=True, return_dict=False)
            ids = list(tokenizer.apply_chat_template(record["prompt"] + record["completion"], return_dict=False))
            labels = [-100] * len(prompt) + ids[len(prompt):]
        else:
            prompt = tokenizer(record["prompt"])["input_ids"]
            completion = tokenizer(record["completion"], add_special_tokens=False)["input_ids"] + [2]
            ids, labels = prompt + completion, [-100] * len(prompt) + completion
        assert len(ids) <= SEQ
        out.append((ids, labels))
    return out


def transformers_loss(model_dir: Path, examples, every_token: bool = False) -> float:
    """transformers' mean next-token loss over the examples' labelled tokens, each example alone."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for ids, labels in examples:
            labels = ids if every_token else labels
            count = sum(1 for label in labels[1:] if label != -100)
            total += model(torch.tensor([ids]), labels=torch.tensor([labels])).loss.double().item() * count
            tokens += count
    return total / tokens


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, setup) -> tuple[list[dict], Path]:
    tmp = tmp_path_factory.mktemp("one")
    return train(tmp, setup, 1), tmp


def test_the_first_loss_is_transformers_loss_over_the_completions_alone(one_process, setup):
    records, tmp = one_process
    model_dir = setup[0]
    examples = reference_examples(model_dir)
    completions = transformers_loss(model_dir, examples)
    assert series(records, "loss")[0] == pytest.approx(completions, rel=REL)
    # the control: the loss over every token of the same examples (the prompts trained too) is
    # another number: 0.26% off at these random weights, ~260 x REL
    every = transformers_loss(model_dir, examples, every_token=True)
    assert abs(every - completions) > 100 * REL * completions
    log = (tmp / "rank-logs" / "rank0.log").read_text()
    assert (f"data: chat examples of train, shuffled (seed 7): 12 examples in 1 file(s), tokenized with the "
            f"tokenizer of directory {model_dir}") in log
    assert f"packed best-fit into {setup[2]} rows of {SEQ}" in log
    # one step of one global batch of every row: one epoch
    assert f"data: 1 step(s) of {setup[2]} rows read {setup[2]} rows: 1 epoch(s) of the {setup[2]} rows" in log
    assert "data: every chat example is a document; document masking on" in log
    assert f"fields not used in training (metadata): source (first in {setup[1] / 'train.jsonl'}:1)" in log


def test_packed_examples_that_see_each_other_train_otherwise(tmp_path, one_process, setup):
    # the control of the masking: the same rows without it (document_masking 0: each example
    # attends to those packed before it, positions run on) are another loss, 7.9e-4 relative
    # (~79 x REL) at these weights and rows, so a chat batch that lost its documents fails above
    crossing = series(train(tmp_path, setup, 1, document_masking=0), "loss")[0]
    masked = series(one_process[0], "loss")[0]
    assert abs(crossing - masked) > 20 * REL * masked


def test_two_fsdp_processes_train_like_one(tmp_path, one_process, setup):
    assert_same_training(train(tmp_path, setup, 2), one_process[0])


def test_a_tokenizer_without_a_chat_template_fails_before_training(tmp_path, setup):
    save_chat_tokenizer(tmp_path / "plain", template=None)
    with pytest.raises(AssertionError) as failure:
        train(tmp_path / "run", setup, 1, tokenizer=str(tmp_path / "plain"))
    message = " ".join(str(failure.value).split())
    assert f"{setup[1] / 'train.jsonl'}:1: a messages example needs a chat template, and the tokenizer of " \
           f"directory {tmp_path / 'plain'} has none" in message
    assert "[metrics]" not in message and not (tmp_path / "run" / "out" / "metrics.jsonl").exists()


def test_the_exported_model_keeps_the_chat_template_and_chats(one_process, setup):
    export = one_process[1] / "model"
    assert (export / "chat_template.jinja").is_file()
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    original = transformers.AutoTokenizer.from_pretrained(setup[0])
    assert tokenizer.chat_template == original.chat_template
    conversation = [SYSTEM, {"role": "user", "content": "Hi there"}]
    prompt = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    assert prompt["input_ids"][0].tolist() == original.apply_chat_template(conversation, add_generation_prompt=True,
                                                                           return_dict=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 5)
    assert isinstance(tokenizer.decode(out[0, prompt["input_ids"].shape[1]:]), str)
