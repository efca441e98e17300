"""tests/support/close.py: "close" measured at a scale that cannot vanish, with the tolerance
derived from the dtype and the sum's length."""

from __future__ import annotations

import pytest
import torch

from tests.support.close import assert_close, order_tolerance, unit_roundoff

U64 = 2.0**-53


def _noise(seed: int) -> torch.Tensor:
    """What a gradient whose terms cancel is left with: rounding noise at inputs of magnitude 1."""
    return torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 4 * U64


def test_noise_at_the_inputs_scale_is_close_and_a_real_error_is_not():
    ours, theirs = _noise(0), _noise(1)
    assert_close(ours, theirs, terms=16, scale=1.0)
    # the control: a real error of one element, 1e-9 at scale 1, far above 16 x u
    wrong = ours.clone()
    wrong[5] += 1e-9
    with pytest.raises(AssertionError, match="16 terms"):
        assert_close(wrong, theirs, terms=16, scale=1.0)


def test_noise_is_not_close_at_its_own_scale():
    """Why `scale` comes from the inputs: against the noise's own size, two roundings of nothing
    differ by ~100% (issue 38's "dq off by 0.99 (relative)")."""
    with pytest.raises(AssertionError):
        assert_close(_noise(0), _noise(1), terms=16)


def test_a_vanishing_reference_needs_a_scale():
    with pytest.raises(ValueError, match="pass scale="):
        assert_close(torch.zeros(3), torch.zeros(3), terms=4)
    assert_close(torch.zeros(3), torch.zeros(3), terms=4, scale=1.0)


def test_python_floats_say_their_dtype():
    losses = [5.54, 5.31, 4.87]
    moved = [x * (1 + 8 * unit_roundoff(torch.float32)) for x in losses]  # 8 fp32 roundings
    with pytest.raises(TypeError, match="dtype="):
        assert_close(moved, losses, terms=64)
    assert_close(moved, losses, terms=64, dtype=torch.float32)
    with pytest.raises(AssertionError):  # the control: the same figures held to fp64's roundoff
        assert_close(moved, losses, terms=64, dtype=torch.float64)


def test_the_tolerance_grows_with_the_sum_and_the_dtype():
    assert order_tolerance(1, torch.float32) == 2.0**-24
    assert order_tolerance(256, torch.float64) == 256 * U64
    assert order_tolerance(10, torch.bfloat16) == 10 * 2.0**-8
    with pytest.raises(ValueError, match="terms=0"):
        order_tolerance(0)
