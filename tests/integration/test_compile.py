"""`compile: 1` through train.py (container.distributed.compile): inductor compiles each block and
the loss on CPU as it does on GPUs, so a compiled run trains like the eager run (losses and
gradient norms within the order tolerance of the sums: inductor fuses and reorders them), alone
and under FSDP2 with the features it composes with; and packed documents whose boundaries move
every step compile nothing new after the first step; context, pipeline and tensor parallelism
compile their ranks' blocks and train like one eager process; LoRA's adapters compile in their
blocks and train like eager LoRA. (Compiled MoE or Transformer Engine FP8 is refused:
tests/unit/test_compile_rules.py.)

The first compile costs ~30 s of an idle CPU core; the module's runs share one inductor cache
(TORCHINDUCTOR_CACHE_DIR), and their kernels are scalar C++ (SCALAR_KERNELS)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from tests.support.train_runs import assert_same_training, run_train, series

SEQ = 64
VOCAB = 256  # llama3-tiny's
# Inductor writes its C++ kernels for the vector ISA that ATEN_CPU_CAPABILITY names; "default" is none
# (scalar loops). What these tests prove is in the graphs, which are the same, and on GPUs the
# kernels are Triton's: scalar, g++ and inductor's code generation take 19% less of this module's
# CPU (BENCHMARKS.md). Given to the ranks alone: the fork server's ATen, chosen as it imported
# torch, stays the machine's for every test after these.
SCALAR_KERNELS = {"ATEN_CPU_CAPABILITY": "default"}


def compiled_run(tmp: Path, nproc: int, **hyperparameters) -> list[dict]:
    return run_train(tmp, nproc, compile=1, env=SCALAR_KERNELS, **hyperparameters)


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    """One inductor cache for the module's runs (their ranks inherit the environment)."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor"))
    yield
    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    return run_train(tmp_path_factory.mktemp("eager"), 1, max_steps=3)


def test_compiled_blocks_under_fsdp2_with_selective_offloaded_checkpointing_and_the_chunked_loss(tmp_path, eager):
    # 2 ranks, FSDP2 over both; the selective policy inside each block's graph, the offloader's
    # hooks eager around it; the loss over chunks of 48 tokens, so each micro-batch's last chunk
    # (2 x 64 - 2 x 48 = 32 tokens) is a second shape
    records = compiled_run(tmp_path, 2, max_steps=3, train_batch_size=2, activation_checkpointing=1,
                        activation_checkpointing_mode="selective", offload_activations=1, loss_chunk_tokens=48)
    assert_same_training(records, eager)
    assert "recompiles" in records[-1] and "recompiles" not in eager[-1]  # the control: eager counts nothing


@pytest.mark.parametrize("mp_parameters", [
    # the all-gathered K/V path's functional collectives trace into each block's graph
    "context_parallel_degree=2",
    # each stage compiles its own blocks; the loss compiles on the last stage
    "pipeline_parallel_degree=2,microbatches=2",
], ids=["cp2", "pp2"])
def test_compiled_blocks_under_context_and_pipeline_parallelism_train_like_one_eager_process(tmp_path, eager,
                                                                                            mp_parameters):
    records = compiled_run(tmp_path, 2, max_steps=3, mp_parameters=mp_parameters)
    assert_same_training(records, eager)
    # every rank compiled its blocks (a stage's, or its sequence chunk's) and nothing after the first step
    for rank in range(2):
        log = (tmp_path / "rank-logs" / f"rank{rank}.log").read_text()
        compiled = re.search(r"compile: (\d+) graph\(s\) compiled by the first step, (\d+) recompilation", log)
        assert compiled and int(compiled[1]) >= 1 and compiled[2] == "0", f"rank {rank}: {compiled}"


def test_compiled_tensor_parallelism_trains_like_one_eager_process_also_from_the_cache(tmp_path, eager):
    # tp 2: the blocks' graphs over DTensor projections, the vocabulary-parallel loss over chunks
    # of 48 tokens (two static shapes), and a validation pass (graphs without gradients). Each
    # run's ranks share the inductor cache, and the second run compiles from what the first left
    # there: torch 2.13's AOTAutograd cache restored these graphs wrong (first loss 6.998), and a
    # compiled first block passed the embedding no gradient (container.distributed.compile)
    validation = tmp_path / "validation"
    validation.mkdir()
    g = torch.Generator().manual_seed(5)
    (validation / "val.jsonl").write_text("".join(json.dumps({"input_ids": torch.randint(0, VOCAB, (SEQ,), generator=g)
                                                              .tolist()}) + "\n" for _ in range(4)))
    args = {"max_steps": 3, "mp_parameters": "tensor_parallel_degree=2", "loss_chunk_tokens": 48,
            "test_dir": str(validation), "validation_freq": 2, "validation_batches": 1}
    for run in ("first", "again"):
        records = compiled_run(tmp_path / run, 2, **args)
        assert_same_training(records, eager)
        assert any("val_loss" in r for r in records)  # the control that validation ran compiled


def test_compiled_lora_trains_like_eager_lora(tmp_path, eager):
    # adapters on every linear layer of the compiled blocks (LoRALinear's A and B in the graph, the base
    # frozen), without dropout (compiled, its masks are inductor's: refused); one process, 3 steps
    lora = {"max_steps": 3, "use_peft": 1, "lora_target_modules": "all-linear", "lora_dropout": 0}
    compiled = compiled_run(tmp_path / "compiled", 1, **lora)
    assert_same_training(compiled, run_train(tmp_path / "eager", 1, **lora))
    assert "recompiles" in compiled[-1]
    # the control: the first loss is the base model's (B starts at zero), the adapters' gradients are not its
    assert compiled[0]["loss"] == eager[0]["loss"] and compiled[0]["grad_norm"] < eager[0]["grad_norm"] / 10


def _packed_rows(channel: Path, steps: int, rows_per_step: int) -> Path:
    """Rows whose documents end at other places every step; the third step's rows are one
    document each (no mask: another graph, once)."""
    g = torch.Generator().manual_seed(11)
    records = []
    for step in range(steps):
        for row in range(rows_per_step):
            cut = 8 + 5 * step + 3 * row
            lengths = (SEQ,) if step == 2 else (cut, SEQ - cut)
            docs = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]
            records.append({"input_ids": [t for d in docs for t in d],
                            "position_ids": [i for d in docs for i in range(len(d))]})
    channel.mkdir()
    (channel / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return channel


def test_moving_document_boundaries_compile_nothing_new_after_the_first_step(tmp_path):
    steps = 5
    channel = _packed_rows(tmp_path / "train", steps, rows_per_step=2)
    args = {"dataset_type": "jsonl", "training_dir": str(channel), "train_batch_size": 2, "max_steps": steps}
    compiled = compiled_run(tmp_path / "compiled", 1, **args)
    # at most one recompilation: the block without a mask (step 3's rows); boundaries are values
    assert [r["recompiles"] for r in compiled] == [0, 0, 1, 1, 1]
    # compiled, the documents are masked as eagerly (the eager run of the same rows matches)
    assert_same_training(compiled, run_train(tmp_path / "eager", 1, **args))
    log = (tmp_path / "compiled" / "rank-logs" / "rank0.log").read_text()
    assert "recompilation(s) after it" in log
    assert series(compiled, "step") == list(range(1, steps + 1))
