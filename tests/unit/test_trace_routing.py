"""A traced step's MoE routing (container.trace.routing): fake tensors have no router values, so each
expert gets an even share of a rank's (token, expert) pairs, as real values the layer can read back,
and the run's routing (container.models.moe.Routing) is back once the trace's context ends."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from container.models.moe import Routing, routed_by, routing
from container.trace.routing import EvenRouting


def test_even_counts_are_real_values_that_add_up_to_the_pairs():
    with FakeTensorMode():
        choices = torch.empty(10, dtype=torch.long)  # 5 tokens x top-2, values unknown
        counts = EvenRouting().counts(choices, 4)
        assert not isinstance(counts, FakeTensor)
        assert counts.tolist() == [3, 3, 2, 2]


def test_the_run_routes_by_the_router_outside_the_trace():
    choices = torch.tensor([0, 2, 2, 3, 2, 0])
    assert routing().counts(choices, 4).tolist() == [2, 0, 3, 1]  # bincount of the choices
    with routed_by(EvenRouting()):
        assert isinstance(routing(), EvenRouting)
        assert routing().counts(choices, 4).tolist() == [2, 2, 1, 1]  # control: the choices ignored
    assert type(routing()) is Routing
