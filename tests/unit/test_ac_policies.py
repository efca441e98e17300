"""torchtitan's selective activation checkpointing as options (container/distributed/parallelize.py):
activation_checkpointing_mode selective_op (its op policy) and activation_checkpointing_freq (its
layer policy) compute exactly what no checkpointing computes, and keep what the planner's memory
model (launcher/plan/terms.py) says they keep, measured as the bytes the forward leaves allocated."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from container.distributed.parallelize import apply_activation_checkpointing, checkpointed_blocks
from container.models.llama import build_model
from launcher.plan.terms import GIB, Ctx, activations
from launcher.wire.training.layout import ParallelLayout
from launcher.wire.training.models import PRESETS
from tests.support.plan_memory import BASE

TINY = PRESETS["llama3-tiny"]
BATCH, SEQ = 4, 64
# What the model leaves allocated besides the blocks' activations is the same in every mode but
# for a few small tensors the memory model does not count (RoPE rows, 64-byte alignment): a few KiB.
SLACK_BYTES = 8 * 1024


@pytest.fixture(scope="module")
def start():
    model = build_model(TINY, SEQ, device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    return model, torch.randint(0, TINY.vocab_size, (BATCH, SEQ))


def checkpointed(model, mode: str | None, freq: int = 1):
    model = copy.deepcopy(model)
    if mode:
        apply_activation_checkpointing(model, mode, freq=freq)
    return model


def loss_and_grads(model, tokens):
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]  # the wrapper renames, never reorders


@pytest.mark.parametrize(("mode", "freq"), [("selective_op", 1), ("full", 2), ("selective_op", 2), ("full", 1)])
def test_checkpointing_policies_compute_exactly_what_no_checkpointing_does(start, mode, freq):
    model, tokens = start
    reference_loss, reference = loss_and_grads(checkpointed(model, None), tokens)
    loss, grads = loss_and_grads(checkpointed(model, mode, freq), tokens)
    assert torch.equal(loss, reference_loss)
    assert len(grads) == len(reference) and all(torch.equal(g, r) for g, r in zip(grads, reference))


def test_every_nth_block_is_checkpointed_as_torchtitan_picks_them():
    assert checkpointed_blocks(6, 1) == [0, 1, 2, 3, 4, 5]
    assert checkpointed_blocks(6, 2) == [1, 3, 5]
    assert checkpointed_blocks(5, 3) == [2]


def kept_bytes(model, tokens) -> int:
    """Bytes the forward leaves allocated (CPU allocations minus frees during it), the output and
    its graph alive until the count is taken."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        output = model(tokens)
    kept = sum(event.self_cpu_memory_usage for event in prof.events())
    del output
    return kept


def predicted_bytes(mode: str | None, freq: int = 1) -> float:
    w = replace(BASE, spec=TINY, seq_len=SEQ, micro_batch=BATCH, compute_bytes=4, layout=ParallelLayout(1, 1, 1, 1, 1),
                ac_mode=mode, ac_freq=freq, offload=False, in_flight=1, microbatches=1)
    return activations(Ctx(w)).gib * GIB


@pytest.mark.parametrize(("mode", "freq"), [("selective_op", 1), ("selective", 1), ("full", 2), (None, 1)])
def test_kept_activations_are_what_the_memory_model_predicts(start, mode, freq):
    """Each mode against full checkpointing (the control: only block inputs), so what is not a
    block's activation cancels out."""
    model, tokens = start
    measured = kept_bytes(checkpointed(model, mode, freq), tokens) - kept_bytes(checkpointed(model, "full"), tokens)
    predicted = predicted_bytes(mode, freq) - predicted_bytes("full")
    assert measured == pytest.approx(predicted, abs=SLACK_BYTES)
    assert predicted > 50 * SLACK_BYTES  # the modes do differ, by far more than the slack


def test_selective_op_keeps_less_than_selective_and_more_than_full(start):
    model, tokens = start
    kept = {mode: kept_bytes(checkpointed(model, mode), tokens) for mode in ("full", "selective_op", "selective")}
    assert kept["full"] < kept["selective_op"] < kept["selective"]
