"""The order smlaunch's train.py trains samples in, decided once (torch-free: validation and the
runtime read the same rules; the order itself is container.data.order).

- `shuffle`: indexed token shards (`dataset_type: indexed`) and the packed rows of chat examples
  (`dataset_type: chat`) are shuffled by default, with the job's seed, epoch after epoch;
  `shuffle: 0` reads them in the order they were packed. JSON Lines channels are read in order
  as a stream (a shuffle would need the whole channel in memory or an index: pack them with
  `--format indexed` to shuffle).
- `data_mixture: "web:0.7,code:0.2,books:0.1"`: train on several indexed channels (the job's
  input channels of those names) with these weights, normalised (Megatron's data blend,
  torchtitan's dataset mix); without it, the `train` channel alone. Every ROUND consecutive
  samples hold each channel's share of them (`round_slots`, which container.data.order lays out),
  so a channel whose share rounds to none is an error, at validation and in the job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from launcher.wire.training.issues import Issue

INDEXED = "indexed"
CHAT = "chat"
# dataset_type: what smlaunch's train.py reads (the hyperparameter's choices, and AWS's argument of that name)
DATASET_TYPES = ("jsonl", INDEXED, CHAT, "synthetic")
SHUFFLED = (INDEXED, CHAT)  # the formats whose rows are found from a sample's index alone, so may be shuffled
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # SageMaker's channel names
_FORMAT = '"channel:weight,channel:weight", e.g. "web:0.7,code:0.3"'
ROUND = 1000  # a mixture's proportions are exact over every ROUND consecutive samples


class MixtureError(ValueError):
    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}; {fix}")


def shuffled(dataset_type: str, shuffle: bool | None) -> bool:
    """Whether samples are shuffled: `shuffle` as given, else on for indexed shards and chat examples."""
    return dataset_type in SHUFFLED if shuffle is None else shuffle


def parse_mixture(text: str | None) -> tuple[tuple[str, float], ...]:
    """`data_mixture` as (channel, weight) pairs, in the order given; () when unset."""
    if text is None or not text.strip():
        return ()
    pairs: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, weight = part.strip().partition(":")
        if not sep or not _NAME.match(name.strip()):
            raise MixtureError(f"{part.strip()!r} is not channel:weight", f"write {_FORMAT}")
        try:
            value = float(weight)
        except ValueError:
            raise MixtureError(f"the weight of {name.strip()} is {weight.strip()!r}, not a number",
                               f"write {_FORMAT}") from None
        if not math.isfinite(value) or value <= 0:
            raise MixtureError(f"the weight of {name.strip()} is {value}", "give every channel a positive weight")
        if any(name.strip() == seen for seen, _ in pairs):
            raise MixtureError(f"channel {name.strip()} is named twice", "name each channel once")
        pairs.append((name.strip(), value))
    return tuple(pairs)


def shares(weights: Sequence[float]) -> list[float]:
    """Positive finite weights as fractions of their total. They are scaled by a power of two
    first, so that weights near the float maximum (1e308) do not sum to inf and every share to
    0; a power of two scales exactly, so other weights get the shares they always had."""
    exponent = math.frexp(max(weights))[1]
    scaled = [math.ldexp(w, -exponent) for w in weights]
    total = sum(scaled)
    return [w / total for w in scaled]


def round_slots(weights: Sequence[float], names: Sequence[str] | None = None, round_size: int = ROUND) -> list[int]:
    """Each data set's samples in every round of `round_size`: its share, rounded by largest
    remainder (they sum to round_size). A set whose share rounds to no sample would never be
    read: MixtureError naming it (`names`, else its position)."""
    exact = [share * round_size for share in shares(weights)]
    slots = [int(x) for x in exact]
    for d in sorted(range(len(exact)), key=lambda d: exact[d] - slots[d], reverse=True)[:round_size - sum(slots)]:
        slots[d] += 1  # largest remainder
    if min(slots) == 0:
        d = slots.index(0)
        name = names[d] if names is not None else f"data set {d}"
        raise MixtureError(f"the weight of {name}, {weights[d]:g}, is {exact[d] / round_size:.2g} of the mixture's "
                           f"total, less than 1/{round_size}: it would get no sample in a round of {round_size}",
                           "raise its weight or leave the channel out")
    return slots


def mixture_issues(hp) -> list[Issue]:
    """data_mixture's form and the job's rule that every channel gets a sample in a round
    (container.data.order.Mixture). Validate runs it (launcher.config.data_rules), and so does the
    container before anything is built: a job made by hand with a malformed mixture must not train
    on the train channel alone."""
    try:
        mixture = parse_mixture(hp.data_mixture)
        if mixture:
            round_slots([w for _, w in mixture], [name for name, _ in mixture])
    except MixtureError as exc:
        return [Issue("hyperparameters.data_mixture", hp.data_mixture, exc.problem, exc.fix)]
    return []


def describe(dataset_type: str, shuffle: bool, seed: int, mixture: tuple[tuple[str, float], ...],
             truncation_mode: str = "keep_start") -> str:
    """The sample stream a data position indexes (a resume must keep it: launcher.wire.training.resume).
    Chat rows are packed from the examples truncation_mode keeps, so it is part of the stream."""
    if dataset_type == CHAT:
        order = f"shuffled with seed {seed}" if shuffle else "in order"
        return f"chat, {order}, truncation_mode {truncation_mode}"
    if dataset_type != INDEXED:
        return dataset_type
    text = f"indexed, shuffled with seed {seed}" if shuffle else "indexed, in order"
    if mixture:
        fractions = shares([w for _, w in mixture])
        text += ", mixture " + ",".join(f"{name}:{share:.6g}" for (name, _), share in zip(mixture, fractions))
    return text
