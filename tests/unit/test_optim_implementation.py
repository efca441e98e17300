"""optimizer_implementation (container/optim.py, launcher/wire/training/speed.py): fused, foreach and for-loop
AdamW update the parameters alike, the one asked for is the one built, and one that cannot run is
refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

from container import optim
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS
from launcher.wire.training.speed import default_optimizer_implementation

TINY = PRESETS["llama3-tiny"]
STEPS, LR = 5, 1e-2


def tiny() -> torch.nn.Module:
    model = build_model(TINY, 64, device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    return model


def trained(model: torch.nn.Module, implementation: str | None) -> torch.optim.Optimizer:
    """STEPS updates from the same seeded gradients, whatever the implementation."""
    optimizer = optim.build_optimizer(model, lr=LR, weight_decay=0.1, implementation=implementation)
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator) * 1e-2
        optimizer.step()
    return optimizer


def test_fused_foreach_and_for_loop_give_the_same_parameters():
    start = tiny()
    models = {name: copy.deepcopy(start) for name in ("fused", "foreach", "for-loop")}
    built = {name: trained(model, name) for name, model in models.items()}
    assert built["fused"].defaults["fused"] is True
    assert built["foreach"].defaults["foreach"] is True and not built["foreach"].defaults["fused"]
    assert not built["for-loop"].defaults["foreach"] and not built["for-loop"].defaults["fused"]
    eps = torch.finfo(torch.float32).eps
    reference = dict(models["for-loop"].named_parameters())
    for name in ("fused", "foreach"):
        for key, p in models[name].named_parameters():
            # fp32, the same formula: each step rounds the update (~lr) and the parameter a few
            # ulps differently, so they part by at most STEPS x (a few ulps of each)
            torch.testing.assert_close(p, reference[key], rtol=STEPS * 8 * eps, atol=STEPS * 8 * eps * LR)
    moved = max((p - q).abs().max().item() for p, q in zip(models["fused"].parameters(), start.parameters()))
    assert moved > LR  # control: the steps did move the parameters, by about lr each


def test_the_default_is_fused_on_cuda_and_torchs_own_loop_elsewhere():
    assert default_optimizer_implementation("adamw", "cuda") == "fused"
    optimizer = trained(tiny(), None)  # CPU parameters: torch's own choice there, its for-loop
    assert not optimizer.defaults["fused"] and not optimizer.defaults["foreach"]
    assert default_optimizer_implementation("anyprecision", "cuda") == "for-loop"


def test_anyprecision_has_no_fused_implementation():
    with pytest.raises(ValueError, match="optimizer=anyprecision has no fused implementation.*for-loop"):
        optim.build_optimizer(tiny(), lr=LR, weight_decay=0.0, kind="anyprecision", implementation="fused")
    built = optim.build_optimizer(tiny(), lr=LR, weight_decay=0.0, kind="anyprecision", implementation="for-loop")
    assert isinstance(built, optim.AnyPrecisionAdamW)  # control


def test_fused_is_refused_where_torch_has_no_kernel(monkeypatch):
    import torch.utils._foreach_utils as foreach_utils

    monkeypatch.setattr(foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cuda"])
    with pytest.raises(ValueError, match="no fused AdamW for cpu parameters.*optimizer_implementation=foreach"):
        optim.build_optimizer(tiny(), lr=LR, weight_decay=0.0, implementation="fused")
    assert optim.build_optimizer(tiny(), lr=LR, weight_decay=0.0, implementation="foreach").defaults["foreach"]
