"""Document masking through train.py: packed rows whose position_ids restart at each document.
The first logged loss is transformers' loss over the same documents, each run alone (the
reference: LlamaForCausalLM, no mask, positions from 0); layouts over several processes train
like the one-process run; and the same rows without masking give another loss (the control).
The in-process half (gradients against the documents alone, record fields): tests/unit/test_document_masking.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.hf_models import VOCAB, llama_config, save_sharp_llama
from tests.support.train_runs import assert_same_training, run_train, series

transformers = pytest.importorskip("transformers")
SEQ = 64
# Four packed rows (one global batch): short and long documents, a row that is one document,
# documents that straddle the middle of the row (where tensor parallelism's sequence cut falls).
ROWS = ((7, 25, 32), (64,), (30, 34), (3, 13, 16, 32))
# fp32, 4 x 64 tokens: the packed step and the documents alone add the same products in other
# orders; layouts are compared on the first step, as later steps also carry the optimizer's
# amplification of those ulps (over 3 steps: 1.5e-5 in grad_norm at tp 2). The order tolerance of
# this loss (tests/support/train_runs.layout_tolerance) is 7e-5, and the layouts here differ by at
# most 2e-7 (here and under MKL_CBWR=COMPATIBLE); this module holds them to 1e-5 all the same, as
# its controls are sized against it: unmasked, the MoE test's first loss moves by only 1.2e-4,
# not a clear margin above 7e-5 (the sharp Llama's moves ~180 x 1e-5).
REL = 1e-5


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path, list[list[list[int]]]]:
    """(model dir, train channel, each row's documents' tokens)."""
    root = tmp_path_factory.mktemp("docmask")
    save_sharp_llama(root / "model", llama_config())
    g = torch.Generator().manual_seed(3)
    rows = [[torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths] for lengths in ROWS]
    return root / "model", write_rows(root / "train", rows, source="test"), rows


def write_rows(channel: Path, rows: list[list[list[int]]], **metadata) -> Path:
    """A channel of packed rows, each record's position_ids restarting at its documents."""
    channel.mkdir()
    records = [{"input_ids": [t for d in docs for t in d], "position_ids": [i for d in docs for i in range(len(d))],
                **metadata} for docs in rows]
    (channel / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return channel


def train(tmp: Path, packed, nproc: int, **hyperparameters) -> list[dict]:
    model, channel, _ = packed
    args = {"model_preset": "", "hf_pretrained_model_name_or_dir": str(model), "dataset_type": "jsonl",
            "training_dir": str(channel), "max_context_width": SEQ, "train_batch_size": 4, "max_steps": 1,
            **hyperparameters}
    return run_train(tmp, nproc, **args)


def transformers_loss(model_dir: Path, sequences: list[list[int]]) -> float:
    """transformers' mean next-token loss over `sequences`, each its own batch of one."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            total += model(ids, labels=ids).loss.double().item() * (len(seq) - 1)
            tokens += len(seq) - 1
    return total / tokens


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, packed) -> list[dict]:
    return train(tmp_path_factory.mktemp("one"), packed, 1)


def test_the_first_loss_is_transformers_loss_of_the_documents_alone(one_process, packed):
    model_dir, _, rows = packed
    alone = transformers_loss(model_dir, [doc for docs in rows for doc in docs])
    assert series(one_process, "loss")[0] == pytest.approx(alone, rel=REL)
    # The control: the rows as whole sequences (what training across documents computes, without
    # the last-token targets it also drops) are another loss, far outside the tolerance.
    whole_rows = transformers_loss(model_dir, [[t for d in docs for t in d] for docs in rows])
    assert abs(whole_rows - alone) > 100 * REL * alone


def test_masking_off_trains_across_documents(tmp_path, one_process, packed):
    crossing = series(train(tmp_path, packed, 1, document_masking=0), "loss")[0]
    masked = series(one_process, "loss")[0]
    assert abs(crossing - masked) > 100 * REL * masked


def test_fsdp_tensor_parallel_checkpointing_and_the_chunked_loss_train_like_one_process(tmp_path, one_process, packed):
    # 4 ranks: 2 data-parallel (FSDP shards over them) x 2 tp ranks, 2 rows each; every block
    # recomputed in backward; the loss over chunks of 24 tokens (not a divisor of a row)
    layout = "tensor_parallel_degree=2,hybrid_shard_degree=2"
    records = train(tmp_path, packed, 4, train_batch_size=2, mp_parameters=layout, activation_checkpointing=1,
                    loss_chunk_tokens=24)
    assert_same_training(records, one_process, rel=REL)


def test_context_parallelism_with_documents_across_its_chunks_trains_like_one_process(tmp_path, one_process, packed):
    # cp 2 cuts each row into 4 chunks of 16 tokens (ranks keep chunks 0+3 and 1+2): every row
    # but the one-document row has a document that spans chunks held by both ranks
    records = train(tmp_path, packed, 2, mp_parameters="context_parallel_degree=2")
    assert_same_training(records, one_process, rel=REL)


def test_pipeline_parallelism_passes_the_documents_to_every_stage(tmp_path, packed):
    # pipeline stages take no pretrained weights yet, so both runs build the model from its
    # config.json with the seed (the one-process weights, trainer and pipeline alike); 1F1B over
    # 2 stages, 2 microbatches of 2 rows: each stage's attention masks by its rows' documents
    one = train(tmp_path / "one", packed, 1, init_from_scratch=1)
    piped = train(tmp_path / "pp2", packed, 2, init_from_scratch=1,
                  mp_parameters="pipeline_parallel_degree=2,microbatches=2")
    assert_same_training(piped, one, rel=REL)
    # the control: at these weights, a pipeline that dropped the documents would be this far off
    crossing = train(tmp_path / "crossing", packed, 1, init_from_scratch=1, document_masking=0)
    assert abs(series(crossing, "loss")[0] - series(one, "loss")[0]) > 100 * REL * series(one, "loss")[0]


@pytest.fixture(scope="module")
def packed_moe(tmp_path_factory) -> Path:
    """ROWS' layout of documents with tokens of mixtral-tiny's 256-token vocabulary."""
    g = torch.Generator().manual_seed(5)
    rows = [[torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths] for lengths in ROWS]
    return write_rows(tmp_path_factory.mktemp("moe") / "train", rows)


def test_mixture_of_experts_with_hybrid_sharding_context_and_expert_parallelism(tmp_path, packed_moe):
    """mixtral-tiny: 4 ranks, hybrid sharding 2 x 2, cp 2 inside each sharding group and ep 2 taken
    from the cp ranks, delayed init and activation checkpointing, like one process (the token
    loss, the gradient norm and the load-balancing loss); the unmasked run is the control."""
    hp = {"model_preset": "mixtral-tiny", "dataset_type": "jsonl", "training_dir": str(packed_moe),
          "max_context_width": SEQ, "train_batch_size": 4, "max_steps": 1}
    one = run_train(tmp_path / "one", 1, **hp)
    layout = "hybrid_shard_degree=2,context_parallel_degree=2,expert_parallel_degree=2"
    composite = run_train(tmp_path / "composite", 4, **{**hp, "train_batch_size": 2}, mp_parameters=layout,
                          delayed_param=1, activation_checkpointing=1)
    assert_same_training(composite, one, rel=REL)
    assert series(composite, "aux_loss") == pytest.approx(series(one, "aux_loss"), rel=REL)
    # the control: unmasked, the first loss moves by 1.2e-4 relative (these weights and rows are
    # fixed, so the figure is too): 12 x REL, so a layout that dropped the documents would fail
    crossing = run_train(tmp_path / "crossing", 1, **hp, document_masking=0)
    assert abs(series(crossing, "loss")[0] - series(one, "loss")[0]) > 5 * REL * series(one, "loss")[0]


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled document kernels)")


@pytest.mark.gpu
@GPU
def test_flex_attention_on_a_gpu_trains_as_transformers_on_the_documents_alone(tmp_path, packed):
    """One process on the GPU, fp32, attention_kernel auto (FlexAttention's compiled kernel there):
    the same first loss as transformers' over the documents alone; the control is the test above."""
    model_dir, _, rows = packed
    records = train(tmp_path, packed, 1, attention_kernel="flex")
    alone = transformers_loss(model_dir, [doc for docs in rows for doc in docs])
    assert series(records, "loss")[0] == pytest.approx(alone, rel=REL)
    assert series(train(tmp_path / "auto", packed, 1), "loss")[0] == pytest.approx(alone, rel=REL)


@pytest.mark.gpu
@GPU
def test_the_kernels_agree_in_bf16_on_a_gpu(tmp_path, packed):
    """bf16 on the GPU, where flash attention's varlen kernel runs: varlen, flex and the dense mask
    give one first loss within one bf16 ulp (2^-8 relative: the kernels differ only in how they
    round attention's output). Masking itself is tested at fp32's resolution (above) and per
    kernel in bf16 against the documents alone (tests/integration/test_document_kernels.py): at
    bf16 these rows' masked and unmasked losses are closer (0.18%) than the rounding."""
    losses = {kernel: series(train(tmp_path / kernel, packed, 1, bf16=1, attention_kernel=kernel), "loss")[0]
              for kernel in ("varlen", "flex", "dense")}
    for kernel in ("varlen", "flex"):
        assert losses[kernel] == pytest.approx(losses["dense"], rel=2.0**-8), losses
