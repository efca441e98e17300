"""The order samples are trained in: a seeded shuffle of each data set's rows, epoch after epoch,
and a weighted mixture of data sets, both functions of the global sample index alone.

So the order does not depend on the world size or on what was read before: any sample is found
in O(1) time and memory (a resume at sample 10^9 costs what one at sample 0 does), every rank
computes the same order, and a job resumed on another number of ranks (docs/spot.md) continues
it exactly.

- `Permutation(n, seed, epoch)`: a pseudo-random bijection of [0, n): a 4-round Feistel network
  keyed by (seed, epoch) over the smallest even number of bits that holds n, round function
  SplitMix64, and cycle-walking back into [0, n) (at most 4 rounds of walking on average). Its
  memory is a few integers, not an n-long array (Megatron's shuffle index of a 10^9-sample
  corpus is 8 GB).
- `Mixture(weights)`: rounds of ROUND slots; data set d takes slots_d of each round (its weight's
  share, rounded by largest remainder: launcher.wire.training.data_order.round_slots), spread through
  the round by smooth weighted round-robin (each slot goes to the set furthest behind its
  share), the same layout every round. Global sample g is then sample k of data set d, with d
  and k from g's round and slot: O(1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from launcher.wire.training.data_order import ROUND, round_slots

_MASK64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class Permutation:
    """A seeded bijection of [0, n); `perm(indices)` maps an int array elementwise."""

    ROUNDS = 4

    def __init__(self, n: int, seed: int, epoch: int = 0):
        if n < 1:
            raise ValueError(f"a permutation of {n} elements")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.half = bits // 2
        self.mask = np.uint64((1 << self.half) - 1)
        base = np.array([(seed * 0x9E3779B97F4A7C15 + epoch * 0xC2B2AE3D27D4EB4F) & _MASK64], dtype=np.uint64)
        self.keys = [_splitmix64(base + np.uint64(r))[0] for r in range(self.ROUNDS)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(self.half), x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_splitmix64(right ^ key) & self.mask)
        return (left << np.uint64(self.half)) | right

    def __call__(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        x = np.asarray(indices, dtype=np.uint64)
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"index {int(x.max())} outside [0, {self.n})")
        y = self._feistel(x)
        outside = y >= np.uint64(self.n)
        while outside.any():  # cycle-walking: the Feistel domain is at most 4n
            y[outside] = self._feistel(y[outside])
            outside = y >= np.uint64(self.n)
        return y.astype(np.int64)


class Mixture:
    """Data sets mixed by weight: `locate(g)` -> (data set, its sample index) for global samples g."""

    def __init__(self, weights: Sequence[float], round_size: int = ROUND, names: Sequence[str] | None = None):
        weights = [float(w) for w in weights]
        if not weights or any(not (0 < w < float("inf")) for w in weights):
            raise ValueError(f"mixture weights must be positive finite numbers, not {weights}")
        slots = round_slots(weights, names, round_size)
        self.slots = np.array(slots, dtype=np.int64)
        self.round_size = round_size
        layout, credit = [], [0] * len(slots)
        for _ in range(round_size):  # smooth weighted round-robin
            for d, s in enumerate(slots):
                credit[d] += s
            pick = max(range(len(slots)), key=lambda d: credit[d])
            credit[pick] -= round_size
            layout.append(pick)
        self.layout = np.array(layout, dtype=np.int64)
        # before[o] = how many of the round's first o slots belong to layout[o]'s data set
        seen = np.zeros(len(slots), dtype=np.int64)
        before = np.empty(round_size, dtype=np.int64)
        for o, d in enumerate(layout):
            before[o] = seen[d]
            seen[d] += 1
        self.before = before

    def locate(self, samples: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        g = np.asarray(samples, dtype=np.int64)
        rounds, slot = np.divmod(g, self.round_size)
        data_set = self.layout[slot]
        return data_set, rounds * self.slots[data_set] + self.before[slot]
