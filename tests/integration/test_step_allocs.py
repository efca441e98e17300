"""Tensor allocations per training step (bench/step_allocs.py counts every op output that does not
share its inputs' storage, step by step and by phase, in train.py's loop, and the bytes of every
tensor alive at each step's end): the loop keeps nothing from one step to the next, and fused
AdamW (the CUDA default) allocates nothing in its update."""

from __future__ import annotations

from container.models.llama import build_model
from launcher.wire.training.models import PRESETS
from tests.support.bench_runs import bench_json


def allocations(*args: str) -> dict:
    return bench_json("step_allocs.py", *args)


def _parameters() -> tuple[int, int]:
    """(parameter tensors, parameter elements) of bench/step_allocs.py's default model."""
    model = build_model(PRESETS["llama3-tiny"], 64, device="meta")
    return len(list(model.parameters())), sum(p.numel() for p in model.parameters())


def test_the_loop_keeps_nothing_from_one_step_to_the_next():
    steps = allocations("--max_steps", "6", "--logging_freq", "3")["steps"]  # logging and checkpoint-free steps
    live = [steps[str(s)]["live_bytes"] for s in range(2, 7)]
    assert len(set(live)) == 1, f"the bytes alive at the end of steps 2-6 grow: {live}"
    # control, that the figure is the training state: fp32 weights and AdamW's two moments at least
    _, elements = _parameters()
    assert live[0] >= 3 * 4 * elements


def test_fused_adamw_allocates_nothing_in_its_update():
    fused = allocations("--optimizer_implementation", "fused", "--max_steps", "3")["steps"]["2"]
    loop = allocations("--optimizer_implementation", "for-loop", "--max_steps", "3")["steps"]["2"]
    assert "optimizer" not in fused, fused
    # control: torch's for-loop AdamW allocates its temporaries for every parameter, every step
    tensors, _ = _parameters()
    assert loop["optimizer"][0] >= tensors
    assert fused["forward_backward"] == loop["forward_backward"]  # the same model's work either way


def test_a_checkpointed_moe_step_keeps_no_recomputed_activations():
    """Activation checkpointing's backward runs each block's forward again, and the MoE layers'
    router statistics were set again by it: their graph held every recomputed block's activations
    up to its router through the optimizer step (21 GiB a rank, Mixtral 8x7B at 8K; found by
    plan --trace). The step's end holds what the same step holds without checkpointing."""
    live = {ac: allocations("--model_preset", "mixtral-tiny", "--activation_checkpointing", ac,
                            "--max_steps", "2")["steps"]["2"]["live_bytes"] for ac in ("0", "1")}
    assert live["1"] == live["0"], live
