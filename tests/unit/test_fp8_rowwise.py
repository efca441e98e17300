"""torchao's FP8 recipes (container/fp8.py, launcher/wire/training/speed.py): rowwise and tensorwise as
fp8_recipe, what each library runs, rowwise's GPU, and FSDP2's FP8 all-gather (tensorwise only).
Emulated on CPU, as tests/unit/test_fp8.py's."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from container import fp8
from container.models.llama import build_model
from launcher.config import FP8Config, ParallelLayout, TrainingHyperparameters
from launcher.wire.training.models import PRESETS

TINY = PRESETS["llama3-tiny"]  # dims 64, 32 (k/v), 176: every projection runs in FP8
E4M3_U = 2.0 ** -4  # e4m3's unit roundoff: 3 mantissa bits, round to nearest


def config(recipe: str) -> FP8Config:
    return FP8Config(enabled=True, backend="torchao", recipe=recipe, emulate=True)


def runtime(world: int = 1, sharding: int = 1) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device("cpu"), world_size=world, rank=0,
                           layout=ParallelLayout(world, 1, sharding, 1, 1))


def tiny() -> torch.nn.Module:
    model = build_model(TINY, 64, device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    return model


def granularity(module) -> str:
    return module.config.cast_config_weight.scaling_granularity.value


def test_rowwise_converts_with_one_scale_per_row():
    rowwise, tensorwise, current = tiny(), tiny(), tiny()
    fp8.apply_fp8(rowwise, config("rowwise"), runtime())
    fp8.apply_fp8(tensorwise, config("tensorwise"), runtime())
    fp8.apply_fp8(current, config("current"), runtime())  # torchao's "current" is tensorwise
    wq = rowwise.layers["0"].attention.wq
    assert granularity(wq) == "axiswise" and wq.config.round_scales_to_power_of_2
    assert granularity(tensorwise.layers["0"].attention.wq) == "tensorwise"  # control
    assert granularity(current.layers["0"].attention.wq) == "tensorwise"


def test_rowwise_linear_is_within_e4m3_rounding():
    """Each product x_i·w_i of an emulated FP8 matmul is off by at most (1+u)² − 1 of |x_i·w_i|
    (both operands rounded to e4m3 with their scales; fp32 accumulation is far finer), so
    |y − y_ref| <= (2u + u²)·(|x| @ |w|ᵀ), elementwise."""
    model, reference = tiny(), tiny()
    fp8.apply_fp8(model, config("rowwise"), runtime())
    torch.manual_seed(1)
    x = torch.randn(128, TINY.hidden_size)
    linear, ref = model.layers["0"].feed_forward.w1, reference.layers["0"].feed_forward.w1
    bound = (2 * E4M3_U + E4M3_U ** 2) * (x.abs() @ ref.weight.abs().T)
    error = (linear(x) - ref(x)).abs()
    assert (error <= bound + 1e-6).all()
    assert error.max() > 0  # FP8 ran


def _losses(model: torch.nn.Module, steps: int = 4) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(2)
    tokens = torch.randint(0, TINY.vocab_size, (4, 64))
    losses = []
    for _ in range(steps):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_rowwise_trains_close_to_high_precision_and_unlike_tensorwise():
    reference = tiny()
    rowwise, tensorwise = copy.deepcopy(reference), copy.deepcopy(reference)
    fp8.apply_fp8(rowwise, config("rowwise"), runtime())
    fp8.apply_fp8(tensorwise, config("tensorwise"), runtime())
    ours, high, other = _losses(rowwise), _losses(reference), _losses(tensorwise)
    assert ours[-1] < ours[0]  # it trains
    # every matmul's products are within 2u + u² (above); the blocks feed the loss through a
    # residual stream that the bf16 embedding dominates, so the loss moves by far less than that
    assert ours == pytest.approx(high, rel=2 * E4M3_U + E4M3_U ** 2)
    assert _apart(ours, high)  # FP8 ran
    assert _apart(ours, other)  # per-row scales, not one per tensor


def _apart(a: list[float], b: list[float]) -> bool:
    """Farther apart than fp32 rounding of the same computation (a few ulps of the loss)."""
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) > 16 * torch.finfo(torch.float32).eps


def test_fsdp_float8_all_gather_and_precomputed_scales_are_tensorwise_only(monkeypatch):
    calls = []
    monkeypatch.setattr(fp8, "_convert_torchao", lambda model, names, recipe, **kw: calls.append((recipe, kw)))
    for recipe in ("rowwise", "tensorwise", "current"):
        fp8.apply_fp8(tiny(), config(recipe), runtime(world=2, sharding=2))
    assert calls == [("rowwise", {"emulate": True, "fsdp_float8_all_gather": False}),
                     ("tensorwise", {"emulate": True, "fsdp_float8_all_gather": True}),
                     ("tensorwise", {"emulate": True, "fsdp_float8_all_gather": True})]
    precomputed = []
    monkeypatch.setattr(fp8, "_torchao_float8", lambda: SimpleNamespace(
        precompute_float8_dynamic_scale_for_fsdp=precomputed.append))
    fp8.precompute_fp8_scales("rowwise model", config("rowwise"))
    fp8.precompute_fp8_scales("tensorwise model", config("tensorwise"))
    assert precomputed == ["tensorwise model"]


def test_rowwise_refused_below_hopper_and_run_on_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L40S")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    cfg = FP8Config(enabled=True, backend="torchao", recipe="rowwise")
    with pytest.raises(RuntimeError, match=r"rowwise needs compute capability >= 9\.0.*NVIDIA L40S.*8\.9.*tensorwise"):
        fp8.needs_emulation(cfg, torch.device("cuda", 0))
    assert fp8.needs_emulation(FP8Config(enabled=True, backend="torchao", recipe="tensorwise"),
                               torch.device("cuda", 0)) is False  # control: Ada runs tensorwise
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8.needs_emulation(cfg, torch.device("cuda", 0)) is False  # H100: real rowwise FP8


@pytest.mark.parametrize(("backend", "recipe", "words"), [
    ("torchao", "delayed", "fp8_recipe=delayed is Transformer Engine's.*fp8_backend=torchao cannot run it"),
    ("transformer_engine", "rowwise", "fp8_recipe=rowwise is torchao's.*fp8_backend=transformer_engine"),
    ("transformer_engine", "tensorwise", "fp8_recipe=tensorwise is torchao's.*set fp8_backend=torchao"),
])
def test_a_recipe_its_library_lacks_is_refused_naming_both(backend, recipe, words):
    with pytest.raises(ValueError, match=words):
        fp8.apply_fp8(tiny(), FP8Config(enabled=True, backend=backend, recipe=recipe, emulate=True), runtime())


def test_torchao_recipes_choose_torchao_when_no_backend_is_named():
    def cfg(**hp):
        return FP8Config.from_hyperparameters(TrainingHyperparameters(fp8=True, **hp))

    assert cfg(fp8_recipe="rowwise").backend == "torchao"
    assert cfg(fp8_recipe="tensorwise").backend == "torchao"
    assert cfg(fp8_recipe="current").backend == "transformer_engine"  # control: TE's recipe keeps TE
    assert cfg().backend == "transformer_engine" and cfg().recipe == "delayed"
    assert cfg(fp8_backend="torchao").recipe == "current"
