"""When floating-point results that two code paths computed are close: one tolerance, derived from
the dtype and the size of the sums, measured against a scale that cannot vanish.

Two computations of one sum of n terms in different orders (another layout, another chunking,
another BLAS kernel or vector width, another thread count) each carry a rounding error of about
sqrt(n) x u x sum(|term|), u being the dtype's unit roundoff (half its machine epsilon), with a
probability that no machine changes (Higham and Mary, "A New Approach to Probabilistic Rounding
Error Analysis", SIAM J. Sci. Comput. 41(5), 2019; the worst case, n x u x sum(|term|), needs every
rounding to err the same way: Higham, "Accuracy and Stability of Numerical Algorithms", 2002, 4.2).
Terms of either sign add up to a result of about sqrt(n) x |term|, so sum(|term|) is about
sqrt(n) x |result| and the two differ by about n x u x |result|. The difference that one machine
happens to show (often none: both paths round alike) is no tolerance; this is.

So a comparison is absolute, |actual - expected| <= terms x u x scale everywhere, `scale` being
the result's magnitude where its terms do not cancel: max |expected| over the whole result, or a
bound from the inputs where the whole result may cancel, never an element's own reference. Where
terms cancel (a gradient through a one-token attention window, a masked position), the reference
is rounding noise, and an error relative to it divides noise by noise (issue 38: dq "off by 0.99
(relative)" on one machine; 0/0 under MKL_CBWR=COMPATIBLE, where the reference is exactly 0).
`terms` counts the additions on the way to one result: for chained reductions (a dot product, then
a softmax's sum, then another product), the sum of their lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: the largest relative error of rounding one result to `dtype` (fp32: 2**-24)."""
    return torch.finfo(dtype).eps / 2


def order_tolerance(terms: int, dtype: torch.dtype = torch.float32) -> float:
    """The tolerance of two sums of `terms` numbers of `dtype` added in different orders, relative
    to the sum's magnitude where its terms do not cancel (the module's docstring derives it)."""
    if terms < 1:
        raise ValueError(f"terms={terms}: count the additions on the way to one result (at least 1)")
    return terms * unit_roundoff(dtype)


def assert_close(actual: torch.Tensor | float | Sequence[float], expected: torch.Tensor | float | Sequence[float],
                 *, terms: int, scale: float | None = None, dtype: torch.dtype | None = None, what: str = "") -> None:
    """Assert |actual - expected| <= order_tolerance(terms, dtype) x scale, element by element.

    `dtype`: the precision the values were computed in (default: `expected`'s, for a tensor; say it
    for Python floats, such as the losses of metrics.jsonl, computed in fp32). `scale`: the
    result's magnitude where nothing cancels (default: max |expected| over all of it). Pass it from the inputs
    wherever the whole result may cancel to rounding noise; a zero scale is refused, as it would
    ask two code paths to round alike."""
    actual_t, expected_t = _as_tensor(actual), _as_tensor(expected)
    if dtype is None:
        if not isinstance(expected, torch.Tensor):
            raise TypeError("assert_close of Python floats: say the dtype they were computed in (dtype=)")
        dtype = expected.dtype
    if scale is None:
        scale = expected_t.abs().max().item() if expected_t.numel() else 0.0
    if not scale > 0:
        raise ValueError(f"{what or 'assert_close'}: scale {scale}: pass scale= from the inputs, as the "
                         "reference vanishes (a tolerance relative to it would demand identical rounding)")
    atol = order_tolerance(terms, dtype) * scale
    torch.testing.assert_close(
        actual_t, expected_t, rtol=0, atol=atol,
        msg=lambda detail: f"{what}: off by more than {terms} terms x u({dtype}) x scale {scale:.3g} = {atol:.3g}"
                           f"\n{detail}")


def _as_tensor(value) -> torch.Tensor:
    """Both sides in float64, so the comparison itself adds no rounding and dtypes may differ."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64)
    return torch.tensor(value, dtype=torch.float64)


def logits_terms(spec, seq: int) -> int:
    """The additions on the way to a Llama's logits (`spec`: a launcher.wire.training.models.ModelSpec):
    per layer the products over hidden, attention's over `seq` keys and the feed-forward's over
    intermediate; then the head's over hidden."""
    return spec.num_layers * (spec.hidden_size + seq + spec.intermediate_size) + spec.hidden_size


def llama_terms(spec, seq: int, tokens: int) -> int:
    """The additions on the way to a Llama's loss or gradients: its logits' (logits_terms), the
    softmax's over the vocabulary, the sum over a batch's `tokens`."""
    return logits_terms(spec, seq) + spec.vocab_size + tokens
