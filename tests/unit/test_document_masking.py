"""Document masking on one process: a packed row whose position_ids restart at each document trains
exactly as its documents run alone from position 0 (the reference: the same model, each document
its own sequence, no mask), and the record fields are used, refused or listed by name.
Layouts over several processes: tests/integration/test_document_masking.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from container.data.loader import IGNORE_INDEX, JsonlSource, build_dataloader, shift_labels
from container.loss import token_loss_sum
from container.models.llama import build_model
from container.run_data import describe_data
from launcher.wire.training.models import PRESETS
from tests.support.close import assert_close, llama_terms, order_tolerance

SPEC = PRESETS["llama3-tiny"]
LENGTHS = (5, 11, 16)  # three documents packed into one 32-token row
SEQ = sum(LENGTHS)
# fp32 throughout: the packed row and the documents alone sum the same products in another order
# (a masked softmax over 32 keys against one over each document's keys): close to the tolerance of
# those sums (tests/support/close.py), each tensor at its whole scale.
TERMS = llama_terms(SPEC, SEQ, SEQ)
REL = order_tolerance(TERMS)  # 5e-5; the controls differ by more than 20 times that


def documents(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, SPEC.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]


def packed_record(docs, **extra) -> dict:
    return {"input_ids": [t for d in docs for t in d], "position_ids": [i for d in docs for i in range(len(d))],
            **extra}


def write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def batch_of(path: Path, document_masking: bool = True) -> dict:
    return build_dataloader(dataset_type="jsonl", path=path, seq_len=SEQ, micro_batch_size=1, dp_rank=0, dp_size=1,
                            vocab_size=SPEC.vocab_size, document_masking=document_masking).next_batch()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = build_model(SPEC, SEQ)
    m.init_weights()
    return m


def loss_and_grads(model, run) -> tuple[float, int, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss, tokens = run()
    (loss / tokens).backward()
    return (loss / tokens).item(), int(tokens), {n: p.grad.clone() for n, p in model.named_parameters()}


def alone(model, docs) -> tuple[torch.Tensor, torch.Tensor]:
    """Each document its own sequence from position 0: the summed token loss and label count."""
    loss, tokens = torch.zeros(()), torch.zeros((), dtype=torch.long)
    for doc in docs:
        ids = torch.tensor([doc])
        doc_loss, doc_tokens = model(ids, labels=shift_labels(ids))
        loss, tokens = loss + doc_loss, tokens + doc_tokens
    return loss, tokens


def assert_grads_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert_close(got[name], want[name], terms=TERMS, what=name)


def test_a_packed_row_trains_exactly_as_its_documents_alone(model, tmp_path):
    docs = documents()
    batch = batch_of(write(tmp_path / "train.jsonl", [packed_record(docs)]))
    assert batch["positions"][0].tolist() == [i for n in LENGTHS for i in range(n)]
    assert batch["documents"][0].tolist() == [d for d, n in enumerate(LENGTHS) for _ in range(n)]

    packed_loss, packed_tokens, packed_grads = loss_and_grads(model, lambda: token_loss_sum(model, batch))
    alone_loss, alone_tokens, alone_grads = loss_and_grads(model, lambda: alone(model, docs))

    assert packed_tokens == alone_tokens == SEQ - len(LENGTHS)  # no document predicts the next one's first token
    assert packed_loss == pytest.approx(alone_loss, rel=REL)
    assert_grads_close(packed_grads, alone_grads)

    # The control: the same row without masking (the seed's behaviour) trains differently.
    unmasked = batch_of(tmp_path / "train.jsonl", document_masking=False)
    assert set(unmasked) == {"input_ids", "labels"}
    crossing_loss, crossing_tokens, _ = loss_and_grads(model, lambda: token_loss_sum(model, unmasked))
    assert crossing_tokens == SEQ - 1
    assert abs(crossing_loss - alone_loss) > 20 * REL * alone_loss


def test_the_chunked_loss_and_a_batch_of_two_rows_keep_it_exact(model, tmp_path):
    """Two rows of different document layouts in one micro-batch: each row's mask is its own."""
    first, second = documents(1), documents(2)[::-1]  # 16, 11, 5 tokens
    batch = build_dataloader(dataset_type="jsonl", path=write(tmp_path / "t.jsonl", [packed_record(first),
                                                                                    packed_record(second)]),
                             seq_len=SEQ, micro_batch_size=2, dp_rank=0, dp_size=1,
                             vocab_size=SPEC.vocab_size).next_batch()
    packed_loss, _, packed_grads = loss_and_grads(model, lambda: token_loss_sum(model, batch, chunk_tokens=7))
    alone_loss, _, alone_grads = loss_and_grads(model, lambda: alone(model, first + second))
    assert packed_loss == pytest.approx(alone_loss, rel=REL)
    assert_grads_close(packed_grads, alone_grads)


def test_hugging_face_flattened_labels_train_the_same(model, tmp_path):
    """DataCollatorWithFlattening writes labels -100 at each document's first token: the same
    targets as the position_ids alone give."""
    docs = documents()
    flattened = [t if i else IGNORE_INDEX for d in docs for i, t in enumerate(d)]
    ours = batch_of(write(tmp_path / "a.jsonl", [packed_record(docs)]))
    theirs = batch_of(write(tmp_path / "b.jsonl", [packed_record(docs, labels=flattened)]))
    assert torch.equal(ours["labels"], theirs["labels"])


def test_rows_without_documents_in_a_batch_with_them_are_one_document(tmp_path):
    docs = documents()
    path = write(tmp_path / "t.jsonl", [packed_record(docs), {"input_ids": [t for d in docs for t in d]}])
    batch = build_dataloader(dataset_type="jsonl", path=path, seq_len=SEQ, micro_batch_size=2, dp_rank=0, dp_size=1,
                             vocab_size=SPEC.vocab_size).next_batch()
    assert batch["positions"][1].tolist() == list(range(SEQ)) and batch["documents"][1].tolist() == [0] * SEQ
    assert (batch["labels"][1] != IGNORE_INDEX).sum() == SEQ - 1


@pytest.mark.parametrize("field", ["cu_seqlens", "document_ids", "token_type_ids", "loss_weight", "messages"])
def test_a_field_that_changes_training_is_refused_by_name(tmp_path, field):
    path = write(tmp_path / "t.jsonl", [packed_record(documents(), **{field: [0]})])
    with pytest.raises(ValueError, match=rf"t.jsonl:1: field '{field}' changes how the record trains"):
        batch_of(path)


def test_metadata_fields_are_listed_once_in_the_job_log(tmp_path, caplog):
    docs = documents()
    path = write(tmp_path / "t.jsonl", [packed_record(docs, text="a", id=1), packed_record(docs, source="web")])
    loader = build_dataloader(dataset_type="jsonl", path=path, seq_len=SEQ, micro_batch_size=2, dp_rank=0, dp_size=1,
                              vocab_size=SPEC.vocab_size)
    loader.next_batch()
    assert loader.source.ignored_fields == {"text": f"{path}:1", "id": f"{path}:1", "source": f"{path}:2"}

    with caplog.at_level(logging.INFO, logger="smlaunch"):
        describe_data(SimpleNamespace(is_main=True), loader.source, SimpleNamespace(document_masking=True))
    assert "records mark documents (position_ids); document masking on" in caplog.text
    assert f"fields not used in training (metadata): text (first in {path}:1), id" in caplog.text


@pytest.mark.parametrize(("positions", "at"), [([1, 2, 3, 4], 0), ([0, 1, 3, 4], 2), ([0, 1, 1, 2], 2)])
def test_position_ids_that_do_not_mark_documents_are_an_error(tmp_path, positions, at):
    path = write(tmp_path / "t.jsonl", [{"input_ids": [1, 2, 3, 4], "position_ids": positions}])
    source = JsonlSource([path], seq_len=4, vocab_size=SPEC.vocab_size)
    expected = rf"t.jsonl:1: position_ids\[{at}\] is {positions[at]}: position_ids start at 0"
    with pytest.raises(ValueError, match=expected):
        source.read(0, 1)


def test_position_ids_of_another_length_are_an_error(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"input_ids": [1, 2, 3, 4], "position_ids": [0, 1, 2]}])
    with pytest.raises(ValueError, match=r"t.jsonl:1: position_ids has shape \(3,\), input_ids \(4,\)"):
        JsonlSource([path], seq_len=4, vocab_size=SPEC.vocab_size).read(0, 1)
