"""The runtime's side of `plan --trace` in this process (torch's fake process group needs no socket):
a layout that cannot be built or stepped fails the trace naming the rank, the module and its
shapes, and the error is the rank's result, not swallowed. The whole trace runs end to end in
tests/integration/test_plan_trace.py."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from launcher.wire.trace_record import TraceRequest, spec_to_dict
from launcher.wire.training.models import PRESETS

torch = pytest.importorskip("torch")

TINY = PRESETS["llama3-tiny"]  # hidden 64, MLP 176: each rank's w1 is [176 / 2, 64] after tp 2


def request(spec=TINY, **mp_parameters) -> TraceRequest:
    return TraceRequest(rank=1, world_size=2, processes_per_host=2,
                        hyperparameters={"model_preset": "llama3-tiny", "dataset_type": "synthetic",
                                         "max_context_width": 64, "train_batch_size": 1, "bf16": True,
                                         "delayed_param": True},
                        mp_parameters=mp_parameters, model=spec_to_dict(spec))


@pytest.fixture(autouse=True)
def _quiet():
    """The fake group's warnings (the rank's variables the trace sets: tests/unit/conftest.py puts them back)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_a_step_that_fails_names_the_rank_the_module_and_its_shapes(monkeypatch):
    from container.models.llama import FeedForward
    from container.trace.step import trace_rank

    def broken(self, x):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(FeedForward, "forward", broken)
    result = trace_rank(request(tensor_parallel_degree=2))
    assert set(result) == {"rank", "error"} and result["rank"] == 1
    error = result["error"]
    assert error.startswith("rank 1 of 2: the step's forward, in layers.0.feed_forward")
    assert "w1.weight (176, 64)" in error and "mat1 and mat2 shapes cannot be multiplied" in error


def test_a_layout_the_runtime_cannot_build_names_the_rank_and_why():
    from container.trace.step import trace_rank

    one_kv_head = dataclasses.replace(TINY, num_kv_heads=1)
    error = trace_rank(request(one_kv_head, tensor_parallel_degree=2))["error"]
    assert error.startswith("rank 1 of 2: parallelizing the model")
    assert "tensor_parallel_degree 2 must divide the model's 1 key/value heads" in error
    control = trace_rank(request(tensor_parallel_degree=2))
    assert "error" not in control and control["parameter_bytes"] > 0


def test_a_lora_job_without_fsdp_traces_its_frozen_base_without_gradients():
    """One process in fp32 runs without FSDP, under torch's MemTracker, which hooked every parameter's
    gradient and failed on the frozen base ("cannot register a hook on a tensor that doesn't require
    gradient"); the full fine-tune, the control, holds gradients for all of it."""
    from container.trace.step import trace_rank
    from launcher.wire.training.hyperparameters import TrainingHyperparameters
    from launcher.wire.training.lora import lora_settings, trainable_parameters

    def traced(**hp) -> dict:
        one = TraceRequest(rank=0, world_size=1, processes_per_host=1, model=spec_to_dict(TINY), mp_parameters={},
                           hyperparameters={"model_preset": "llama3-tiny", "dataset_type": "synthetic",
                                            "max_context_width": 64, "train_batch_size": 1, "bf16": False, **hp})
        result = trace_rank(one)
        assert "error" not in result, result
        return result

    lora, full = traced(use_peft=True), traced()
    adapters = trainable_parameters(TINY, lora_settings(TrainingHyperparameters(use_peft=True), TINY))[0]
    assert lora["gradient_bytes"] == 4 * adapters  # fp32
    assert full["gradient_bytes"] == full["parameter_bytes"] > 10 * lora["gradient_bytes"]
