"""FP8 conversion (container/fp8.py) on single modules: which linears are swapped, refusals on
hardware without FP8, torchao emulation on CPU and on the meta device. Transformer Engine tests
need an FP8 GPU with TE installed and skip elsewhere."""

from __future__ import annotations

import dataclasses
import importlib.util
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from container import fp8
from container.models.llama import build_model
from launcher.config import FP8Config, ParallelLayout, TrainingHyperparameters
from launcher.wire.training.models import PRESETS

TINY = PRESETS["llama3-tiny"]  # dims 64, 32 (k/v), 176: all multiples of 16
TORCHAO = FP8Config(enabled=True, backend="torchao", recipe="current", emulate=True)


def runtime(device: str = "cpu") -> SimpleNamespace:
    """The fields of container.distributed.runtime.Runtime that apply_fp8 reads, for one process."""
    return SimpleNamespace(device=torch.device(device), world_size=1, rank=0, layout=ParallelLayout(1, 1, 1, 1, 1))


def tiny(spec=TINY, device: str = "cpu", seed: int = 0):
    model = build_model(spec, 64, device=device)
    if device != "meta":
        torch.manual_seed(seed)
        model.init_weights()
    return model


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_torchao_swaps_the_projections_only():
    from torchao.float8.float8_linear import Float8Linear

    model = tiny()
    keys = set(model.state_dict())
    fp8.apply_fp8(model, TORCHAO, runtime())
    swapped = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped == {f"layers.{i}.{part}.{w}" for i in range(2)
                       for part, ws in (("attention", "wq wk wv wo"), ("feed_forward", "w1 w2 w3"))
                       for w in ws.split()}
    assert type(model.output) is nn.Linear and type(model.tok_embeddings) is nn.Embedding
    assert set(model.state_dict()) == keys  # checkpoints and HF export see the same names


def test_torchao_emulation_quantizes_within_fp8_tolerance():
    model, reference = tiny(), tiny()
    fp8.apply_fp8(model, TORCHAO, runtime())
    x = torch.randn(128, TINY.hidden_size)
    w1, ref_w1 = model.layers["0"].feed_forward.w1, reference.layers["0"].feed_forward.w1
    # E4M3 keeps 3 mantissa bits (rounding error up to 6%): measured 3.7% here
    assert 0.005 < relative_error(w1(x), ref_w1(x)) < 0.08
    tokens = torch.randint(0, TINY.vocab_size, (2, 64))
    assert 0 < relative_error(model(tokens), reference(tokens)) < 0.01


def test_torchao_swaps_gpt_neox_biased_projections():
    from torchao.float8.float8_linear import Float8Linear

    from launcher.wire.training.model_resolution import resolve_model

    spec = resolve_model(TrainingHyperparameters(model_type="gpt_neox", hidden_width=64, num_layers=2, num_heads=4,
                                                 vocab_size=256, max_context_width=64)).spec
    model, reference = tiny(spec), tiny(spec)
    keys = set(model.state_dict())
    fp8.apply_fp8(model, TORCHAO, runtime())
    swapped = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped == {f"layers.{i}.{w}" for i in range(2)
                       for w in ("attention.wqkv", "attention.wo", "feed_forward.w1", "feed_forward.w2")}
    assert set(model.state_dict()) == keys and model.layers["0"].attention.wqkv.bias is not None
    tokens = torch.randint(0, spec.vocab_size, (2, 64))
    assert 0 < relative_error(model(tokens), reference(tokens)) < 0.01


def test_transformer_engine_refuses_biased_projections(monkeypatch):
    from launcher.wire.training.model_resolution import resolve_model

    spec = resolve_model(TrainingHyperparameters(model_type="gpt_neox", hidden_width=64, num_layers=2, num_heads=4,
                                                 vocab_size=256, max_context_width=64)).spec
    monkeypatch.setattr(fp8, "needs_emulation", lambda cfg, device: False)  # as on an H100
    cfg = FP8Config(enabled=True, backend="transformer_engine")
    with pytest.raises(ValueError, match="biased projections.*use fp8_backend=torchao"):
        fp8.apply_fp8(tiny(spec), cfg, runtime())


def test_projections_with_dims_not_multiple_of_16_stay_in_bf16():
    spec = dataclasses.replace(TINY, intermediate_size=168)
    model = tiny(spec)
    names, skipped = fp8.fp8_projections(model)
    assert skipped == [f"layers.{i}.feed_forward.{w}" for i in range(2) for w in ("w1", "w2", "w3")]
    assert names == [f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")]
    fp8.apply_fp8(model, TORCHAO, runtime())
    assert type(model.layers["0"].feed_forward.w1) is nn.Linear
    assert type(model.layers["0"].attention.wq) is not nn.Linear


def test_meta_device_conversion_then_weights_equals_eager_conversion():
    """Delayed init converts the meta model; weights loaded afterwards give the eager result."""
    eager, delayed = tiny(), tiny(device="meta")
    fp8.apply_fp8(eager, TORCHAO, runtime())
    fp8.apply_fp8(delayed, TORCHAO, runtime())
    assert delayed.layers["0"].attention.wq.weight.is_meta
    delayed.to_empty(device="cpu")
    delayed.init_buffers()
    delayed.load_state_dict(tiny().state_dict())  # as the rank-0 broadcast does
    tokens = torch.randint(0, TINY.vocab_size, (2, 64))
    torch.testing.assert_close(delayed(tokens), eager(tokens), rtol=0, atol=0)


def test_refuses_cpu_without_emulation():
    cfg = FP8Config(enabled=True, backend="torchao", recipe="current")
    with pytest.raises(RuntimeError) as err:
        fp8.apply_fp8(tiny(), cfg, runtime())
    message = str(err.value)
    assert "CPU" in message and "compute capability >= 8.9" in message
    assert "fp8_emulate=1" in message and "fp8_backend=torchao" in message and "p5" in message


def test_refuses_a100_without_emulation(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    cfg = FP8Config(enabled=True)  # the client's default backend: Transformer Engine
    with pytest.raises(RuntimeError, match=r"NVIDIA A100-SXM4-40GB \(compute capability 8\.0\).*Fix: run on"):
        fp8.needs_emulation(cfg, torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8.needs_emulation(cfg, torch.device("cuda", 0)) is False  # H100: real FP8


def test_transformer_engine_cannot_emulate():
    cfg = FP8Config(enabled=True, backend="transformer_engine", emulate=True)
    with pytest.raises(RuntimeError, match="Transformer Engine cannot emulate FP8.*fp8_backend=torchao"):
        fp8.apply_fp8(tiny(), cfg, runtime())


def test_torchao_refuses_delayed_scaling():
    cfg = FP8Config(enabled=True, backend="torchao", recipe="delayed", emulate=True)
    with pytest.raises(ValueError, match="fp8_recipe=delayed is Transformer Engine.s.*tensorwise or rowwise"):
        fp8.apply_fp8(tiny(), cfg, runtime())


def test_client_hyperparameters_map_to_the_config():
    hp = TrainingHyperparameters(fp8=True, fp8_backend="torchao", fp8_emulate=True)
    assert FP8Config.from_hyperparameters(hp) == TORCHAO  # torchao's default recipe is "current"


def test_selective_checkpointing_is_refused_with_transformer_engine():
    cfg = FP8Config(enabled=True, backend="transformer_engine")
    with pytest.raises(ValueError, match="activation_checkpointing_mode=full"):
        fp8.activation_checkpoint_fn(cfg, "selective")
    assert fp8.activation_checkpoint_fn(TORCHAO, "selective") is None  # torch's own checkpoint


# --- Transformer Engine: an FP8 GPU with TE installed ------------------------------------------

def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= fp8.MIN_CAPABILITY


needs_te = pytest.mark.skipif(not _fp8_gpu() or importlib.util.find_spec("transformer_engine") is None,
                              reason="needs an FP8 GPU (compute capability >= 8.9) and Transformer Engine")
DELAYED = FP8Config(enabled=True, backend="transformer_engine", recipe="delayed", amax_history_len=16,
                    amax_compute_algo="most_recent", margin=1)


def _te_state():
    try:
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager
    except ImportError:  # Transformer Engine before the quantization module
        from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
    return FP8GlobalStateManager


@pytest.mark.gpu
@needs_te
def test_te_delayed_scaling_recipe_reaches_the_forward():
    recipe = fp8.te_recipe(DELAYED)
    assert (recipe.amax_history_len, recipe.amax_compute_algo, recipe.margin) == (16, "most_recent", 1)
    assert recipe.fp8_format.name == "HYBRID"
    model = tiny(device="cuda")
    fp8.apply_fp8(model, DELAYED, runtime("cuda"))
    seen = []
    model.layers["0"].attention.wq.register_forward_pre_hook(
        lambda *_: seen.append((_te_state().is_fp8_enabled(), _te_state().get_fp8_recipe())))
    model(torch.randint(0, TINY.vocab_size, (2, 64), device="cuda"))
    enabled, active = seen[0]
    assert enabled and (active.amax_history_len, active.amax_compute_algo, active.margin) == (16, "most_recent", 1)


@pytest.mark.gpu
@needs_te
def test_te_linear_swap_keeps_the_forward_within_fp8_tolerance():
    import transformer_engine.pytorch as te

    model, reference = tiny(device="cuda"), tiny(device="cuda")
    fp8.apply_fp8(model, DELAYED, runtime("cuda"))
    assert isinstance(model.layers["1"].feed_forward.w2, te.Linear) and type(model.output) is nn.Linear
    assert set(model.state_dict()) == set(reference.state_dict())
    torch.testing.assert_close(model.layers["1"].feed_forward.w2.weight, reference.layers["1"].feed_forward.w2.weight)
    tokens = torch.randint(0, TINY.vocab_size, (2, 64), device="cuda")
    for _ in range(3):  # delayed scaling: the first steps run on the initial scale of 1
        model(tokens).float().sum().backward()
    with torch.no_grad():
        assert relative_error(model(tokens).float(), reference(tokens).float()) < 0.02


@pytest.mark.gpu
@needs_te
def test_te_current_scaling_recipe():
    from transformer_engine.common import recipe

    if not hasattr(recipe, "Float8CurrentScaling"):
        pytest.skip("Transformer Engine before 2.2 has no current scaling")
    current = FP8Config(enabled=True, backend="transformer_engine", recipe="current")
    assert isinstance(fp8.te_recipe(current), recipe.Float8CurrentScaling)
    model, reference = tiny(device="cuda"), tiny(device="cuda")
    fp8.apply_fp8(model, current, runtime("cuda"))
    tokens = torch.randint(0, TINY.vocab_size, (2, 64), device="cuda")
    with torch.no_grad():
        assert 0 < relative_error(model(tokens).float(), reference(tokens).float()) < 0.02


@pytest.mark.gpu
@needs_te
def test_te_checkpoint_function_recomputes_under_fp8():
    """TE's checkpoint recomputes with the forward's FP8 scales: the gradients equal those of the
    same model without checkpointing (a bf16 recompute would be off by FP8's error, ~3%)."""
    from container.distributed.parallelize import apply_activation_checkpointing

    model, plain = tiny(device="cuda"), tiny(device="cuda")
    for m in (model, plain):
        fp8.apply_fp8(m, DELAYED, runtime("cuda"))
    apply_activation_checkpointing(model, "full", checkpoint_fn=fp8.activation_checkpoint_fn(DELAYED, "full"))
    tokens = torch.randint(0, TINY.vocab_size, (2, 64), device="cuda")
    for m in (model, plain):
        m(tokens).float().sum().backward()
    grad, plain_grad = model.layers["0"].attention.wq.weight.grad, plain.layers["0"].attention.wq.weight.grad
    torch.testing.assert_close(grad, plain_grad, rtol=1e-3, atol=1e-6)
