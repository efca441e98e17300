"""AWS's model types through train.py: GPT-NeoX, Mistral with a sliding window and a top-1 Mixtral,
built from the script's size arguments, train exactly like one process under FSDP (with delayed
init and selective checkpointing), tensor parallelism (GPT-NeoX's own plan, with biases),
context parallelism (the window across chunks), pipeline parallelism and expert parallelism:
loss and gradient norm (and the aux loss) within train_runs.REL over 6 steps. The export loads in
transformers as the model trained, its config saying so (the experts per token, the window).
The models against transformers in one process: tests/unit/test_model_types.py."""

from __future__ import annotations

import json

import pytest
import torch

from container.checkpoint.hf_export import load_hf_weights
from container.models.llama import build_model
from launcher.config import TrainingHyperparameters
from launcher.wire.training.model_resolution import resolve_model
from tests.support.close import assert_close, logits_terms
from tests.support.train_runs import REL, TINY, assert_same_training, run_train, series

transformers = pytest.importorskip("transformers")
SIZES = {"model_preset": None, "hidden_width": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256}
MODELS = {
    "gpt_neox": {**SIZES, "model_type": "gpt_neox"},
    # a window of 24 over 64 tokens: under cp 2 the 16-token chunks attend across chunk boundaries
    "mistral": {**SIZES, "model_type": "mistral", "num_key_value_heads": 2, "intermediate_size": 96,
                "sliding_window": 24},
    "mixtral": {**SIZES, "model_type": "mixtral", "num_key_value_heads": 2, "intermediate_size": 96,
                "num_local_experts": 4, "num_experts_per_tok": 1, "router_aux_loss_coef": 0.02},
}
LAYOUTS = {
    "gpt_neox": {"fsdp2": (2, {"train_batch_size": 2}),
                 # the reference's weights broadcast from rank 0, blocks recomputed keeping the biased matmuls
                 "fsdp2-delayed-selective": (2, {"train_batch_size": 2, "delayed_param": 1,
                                                 "activation_checkpointing": 1,
                                                 "activation_checkpointing_mode": "selective"}),
                 "pp2": (2, {"mp_parameters": "pipeline_parallel_degree=2,microbatches=2"}),
                 "tp2": (2, {"mp_parameters": "tensor_parallel_degree=2"}),
                 "cp2": (2, {"mp_parameters": "context_parallel_degree=2"}),
                 "tp2-fsdp2": (4, {"train_batch_size": 2, "mp_parameters": "tensor_parallel_degree=2,"
                                                                         "hybrid_shard_degree=2"})},
    "mistral": {"fsdp2": (2, {"train_batch_size": 2}),
                "cp2": (2, {"mp_parameters": "context_parallel_degree=2"}),
                "tp2-cp2": (4, {"mp_parameters": "tensor_parallel_degree=2,context_parallel_degree=2"})},
    "mixtral": {"fsdp2": (2, {"train_batch_size": 2}),
                "ep2": (2, {"train_batch_size": 2, "mp_parameters": "expert_parallel_degree=2"}),
                "cp2": (2, {"mp_parameters": "context_parallel_degree=2"})},
}
CASES = [(model, layout) for model, layouts in LAYOUTS.items() for layout in layouts]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """One process of each model: (metrics, run directory), made on first use."""
    runs: dict = {}

    def get(model: str):
        if model not in runs:
            path = tmp_path_factory.mktemp(model)
            runs[model] = run_train(path, 1, **MODELS[model]), path
        return runs[model]

    return get


@pytest.mark.parametrize("model, layout", CASES, ids=[f"{model}-{layout}" for model, layout in CASES])
def test_layouts_match_one_process(tmp_path, references, model, layout):
    reference, _ = references(model)
    nproc, extra = LAYOUTS[model][layout]
    records = run_train(tmp_path, nproc, **MODELS[model], **extra)
    assert_same_training(records, reference)
    if model == "mixtral":
        assert series(records, "aux_loss") == pytest.approx(series(reference, "aux_loss"), rel=REL)


@pytest.mark.parametrize("model", list(MODELS))
def test_the_export_is_the_trained_model_in_transformers(references, model):
    records, path = references(model)
    losses = series(records, "loss")
    assert len(losses) == 6 and losses[-1] < losses[0]
    hp = TrainingHyperparameters.model_validate({k: v for k, v in {**TINY, **MODELS[model]}.items() if v is not None})
    spec = resolve_model(hp).spec
    config = json.loads((path / "model" / "config.json").read_text())
    assert config["model_type"] == model
    if model == "mixtral":  # the routing it trained with
        assert (config["num_experts_per_tok"], config["router_aux_loss_coef"]) == (1, 0.02)
    if model == "mistral":
        assert config["sliding_window"] == 24
    ours = build_model(spec, TINY["max_context_width"])
    load_hf_weights(ours, path / "model")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path / "model").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, TINY["max_context_width"]),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close(ours.eval()(tokens), loaded(tokens).logits, terms=logits_terms(spec, TINY["max_context_width"]),
                     what=f"{model}: logits")
