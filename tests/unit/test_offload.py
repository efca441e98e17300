"""Activation offloading keeps gradients exact, moves only activations, and prefetches within the horizon."""

from __future__ import annotations

import pytest
import torch

from container.distributed.offload import ActivationOffloader
from container.distributed.parallelize import apply_activation_checkpointing
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS

SPEC = PRESETS["llama3-tiny"].__class__(**{**PRESETS["llama3-tiny"].__dict__, "num_layers": 5})


def grads(model, tokens):
    model.zero_grad()
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_offloaded_checkpointing_gives_the_same_gradients(mode):
    torch.manual_seed(0)
    plain = build_model(SPEC, 32)
    plain.init_weights()
    offloaded = build_model(SPEC, 32)
    offloaded.load_state_dict(plain.state_dict())
    offloader = ActivationOffloader(horizon=2, device=torch.device("cpu"), copy_on_cpu=True)
    apply_activation_checkpointing(offloaded, mode, offloader)
    tokens = torch.randint(0, SPEC.vocab_size, (2, 33))
    expected, got = grads(plain, tokens), grads(offloaded, tokens)
    assert offloaded.state_dict().keys() == plain.state_dict().keys()  # checkpoint names unchanged
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0)


def test_only_activations_move_and_prefetch_stays_within_the_horizon():
    torch.manual_seed(0)
    model = build_model(SPEC, 32)
    model.init_weights()
    offloader = ActivationOffloader(horizon=2, device=torch.device("cpu"), copy_on_cpu=True)
    apply_activation_checkpointing(model, "full", offloader)
    tokens = torch.randint(0, SPEC.vocab_size, (2, 33))
    logits = model(tokens[:, :-1])
    # each block offloads its input activation only, not the RoPE tables it also receives
    assert {i: len(s) for i, s in offloader.saved.items()} == {i: 1 for i in range(5)}
    assert all(s[0].host.shape == (2, 32, SPEC.hidden_size) for s in offloader.saved.values())
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    # backward visits blocks 4..0; at block i the next two (i-1, i-2) are fetched ahead, once each
    assert offloader.prefetched == [3, 2, 1, 0]
    assert all(s.on_device is None for saved in offloader.saved.values() for s in saved)


def test_cpu_without_copy_moves_nothing():
    offloader = ActivationOffloader(horizon=2, device=torch.device("cpu"))
    x = torch.randn(3, requires_grad=True) * 2
    assert offloader.pack(0, x) is x
