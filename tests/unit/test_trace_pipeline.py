"""A traced pipeline stage (container.trace.pipeline): given its shapes up front, it steps on the
fake group with no peers; a stage whose own output differs from the shapes the trace gave the next
stage fails the trace, naming them, instead of tracing the wrong tensors."""

from __future__ import annotations

import warnings

import pytest
import torch

from container.trace import pipeline
from container.trace.step import trace_rank
from launcher.wire.trace_record import TraceRequest, spec_to_dict
from launcher.wire.training.models import PRESETS


def first_stage() -> dict:
    request = TraceRequest(rank=0, world_size=2, processes_per_host=2,
                           hyperparameters={"model_preset": "llama3-tiny", "max_context_width": 64,
                                            "train_batch_size": 4, "max_steps": 2, "bf16": 1},
                           mp_parameters={"pipeline_parallel_degree": 2, "microbatches": 2, "hybrid_shard_degree": 1},
                           model=spec_to_dict(PRESETS["llama3-tiny"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fake group's
        return trace_rank(request)


def test_the_first_stage_sends_and_receives_its_microbatches():
    result = first_stage()
    assert "error" not in result, result
    sends = {c["kind"]: c["count"] for c in result["collectives"] if c["group"] == "pp"}
    # 2 microbatches: each one's hidden state forward, each one's gradient back
    assert sends["send"] == 2 and sends["recv"] == 2


def test_a_wrong_shape_fails_the_trace(monkeypatch):
    real = pipeline.hidden_state

    def too_short(rt, s, spec) -> torch.Tensor:
        hidden = real(rt, s, spec)
        return hidden.new_empty(hidden.shape[0], hidden.shape[1] // 2, hidden.shape[2]).requires_grad_()

    monkeypatch.setattr(pipeline, "hidden_state", too_short)
    result = first_stage()
    assert "the trace's shapes are wrong" in result.get("error", ""), result
    assert "(2, 64, 64)" in result["error"] and "(2, 32, 64)" in result["error"]


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
