"""The client learns MoE: validation of expert parallelism against the model and the layout, the
Mixtral Hub names, and the planner's MoE terms, derived by hand from Mixtral 8x7B's shapes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.config import ConfigError, validate_job
from launcher.plan.memory import GIB, estimate_workload
from launcher.plan.workload import workload_of
from launcher.wire.training.models import PRESETS

MP = "distribution.smdistributed.modelparallel.parameters"
MIXTRAL = PRESETS["mixtral-8x7b"]


def job(source_dir, params=None, **hp):
    return {
        "entry_point": "train.py", "source_dir": str(source_dir), "instance_type": "ml.p5.48xlarge",
        "instance_count": 2,
        "hyperparameters": {"bf16": 1, "max_context_width": 4096, "model_preset": "mixtral-8x7b", **hp},
        "distribution": {"torch_distributed": {"enabled": True},
                         "smdistributed": {"modelparallel": {"enabled": True, "parameters": params or {}}}},
    }


def errors(data) -> dict[str, str]:
    try:
        validate_job(data)
    except ConfigError as exc:
        return {i.path: i.problem for i in exc.issues}
    return {}


def test_expert_parallelism_of_a_mixtral_validates(runtime_dir):
    assert errors(job(runtime_dir, {"expert_parallel_degree": 8})) == {}
    assert errors(job(runtime_dir, {"expert_parallel_degree": 2, "hybrid_shard_degree": 4,
                                    "context_parallel_degree": 2})) == {}


@pytest.mark.parametrize("params, key, says", [
    ({"expert_parallel_degree": 16}, "expert_parallel_degree", "does not divide the model's 8 experts"),
    ({"expert_parallel_degree": 4, "hybrid_shard_degree": 2}, "expert_parallel_degree",
     "does not divide the sharding group (2 ranks)"),
    ({"tensor_parallel_degree": 2}, "tensor_parallel_degree", "no tensor parallelism"),
])
def test_what_the_runtime_cannot_run_is_refused(runtime_dir, params, key, says):
    assert says in errors(job(runtime_dir, params))[f"{MP}.{key}"]


def test_a_script_of_its_own_may_tensor_parallelise_its_moe(user_script_dir):
    data = job(user_script_dir, {"tensor_parallel_degree": 2}, model_preset=None, model_type="mixtral",
               num_local_experts=8)
    data.update(framework_version="2.4.1", py_version="py311")
    assert f"{MP}.tensor_parallel_degree" not in errors(data)


def test_mixtral_hub_name_is_known_without_the_hub(runtime_dir):
    data = job(runtime_dir, {"expert_parallel_degree": 8}, model_preset=None,
               hf_pretrained_model_name_or_dir="mistralai/Mixtral-8x7B-v0.1")
    assert validate_job(data).model == MIXTRAL


def _workload(source_dir, ep):
    return workload_of(validate_job(job(source_dir, {"expert_parallel_degree": ep}, activation_checkpointing=1)))


def test_expert_parallelism_gathers_only_the_local_experts(runtime_dir):
    """16 ranks shard everything either way; an all-gathered block holds 8 experts at ep 1 and 1
    at ep 8: 7 x 3·h·I parameters fewer, in bf16, for the running and the prefetched block."""
    dense_gather, ep_gather = (estimate_workload(_workload(runtime_dir, ep)) for ep in (1, 8))
    assert dense_gather.gib("parameters") == ep_gather.gib("parameters")
    saved = 2 * 2 * 7 * 3 * 4096 * 14336
    assert dense_gather.gib("gathered_forward") - ep_gather.gib("gathered_forward") == pytest.approx(
        saved / GIB, rel=1e-9)


def test_parameters_count_every_expert_and_the_router(runtime_dir):
    s = MIXTRAL
    h, d = s.hidden_size, s.head_dim
    block = 2 * h * s.num_heads * d + 2 * h * s.num_kv_heads * d + 8 * 3 * h * s.intermediate_size + h * 8 + 2 * h
    total = s.num_layers * block + 2 * s.vocab_size * h + h
    assert 46e9 < total < 47e9  # Mixtral 8x7B's published 46.7B
    assert estimate_workload(_workload(runtime_dir, 8)).gib("parameters") == pytest.approx(4 * total / 16 / GIB)


def test_activations_count_the_experts_each_token_visits(runtime_dir):
    """No checkpointing: per token and layer, k - 1 more SwiGLU visits (4·a·I each), the dispatch
    copies 2·k·a·h and the router's fp32 logits and probabilities 8·E, against a dense model."""
    w = replace(_workload(runtime_dir, 8), ac_mode=None)
    dense = replace(w, spec=replace(MIXTRAL, num_experts=0))
    extra = 4 * 2 * 14336 + 2 * 2 * 2 * 4096 + 8 * 8
    n = w.tokens_per_rank
    assert estimate_workload(w).gib("activations") - estimate_workload(dense).gib("activations") == pytest.approx(
        32 * extra * n / GIB, rel=1e-9)
