"""`python -m container.data inspect DIR --mixture web:0.7,code:0.3 --max-context-width N`: what a
job's `data_mixture` takes from each of its indexed channels (DIR/web, DIR/code: DIR is where the
channels are, as /opt/ml/input/data is in a job). The channels are opened as the job opens them
(container.data.indexed_source's IndexedSource, with its checks: a channel with less than one row is
its error) and the samples are counted from the job's own sampler (its Mixture's slots a round and
their layout), so the figures are the job's: each channel's samples in every 1,000, and over
`--samples` global samples how many it gives and how many epochs of its rows that is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from container.data.indexed_source import Channel, IndexedSource
from launcher.wire.training.data_order import ROUND, MixtureError, parse_mixture, shares


class MixtureOptionError(ValueError):
    """A --mixture that names no channel of DIR, or is malformed: the value and the fix."""


def open_mixture(path: Path, text: str, width: int) -> IndexedSource:
    """The job's source of the mixture `text` over the channels under `path`."""
    try:
        pairs = parse_mixture(text)
    except MixtureError as exc:
        raise MixtureOptionError(f"--mixture {text!r}: {exc}") from None
    missing = [name for name, _ in pairs if not (path / name).is_dir()]
    if missing:
        raise MixtureOptionError(f"--mixture {text!r} names channel(s) {', '.join(missing)}, and {path} has no "
                                 f"{', '.join(missing)} directory: give the directory holding the channels, each "
                                 "in a directory of its name")
    channels = [Channel(name, path / name, weight) for name, weight in pairs]
    try:
        # inspect has no model: its vocabulary is not checked (validate and the job check it)
        return IndexedSource(channels, width, sys.maxsize, seed=0, shuffle=False)
    except MixtureError as exc:
        raise MixtureOptionError(f"--mixture {text!r}: {exc}") from None


def taken(source: IndexedSource, samples: int) -> list[int]:
    """How many of global samples [0, samples) each channel gives: whole rounds by the sampler's
    slots, the rest located by it one by one."""
    mixture = source.mixture
    if mixture is None:
        return [samples]
    rounds, _ = divmod(samples, mixture.round_size)
    rest, _ = mixture.locate(np.arange(rounds * mixture.round_size, samples, dtype=np.int64))
    return (rounds * mixture.slots + np.bincount(rest, minlength=len(mixture.slots))).tolist()


def report(path: Path, text: str, width: int, samples: int) -> dict:
    source = open_mixture(path, text, width)
    per_round = source.mixture.slots.tolist() if source.mixture is not None else [ROUND]
    rows = []
    for channel, stream, n, slots, count, share in zip(source.channels, source.streams, source.rows, per_round,
                                                        taken(source, samples),
                                                        shares([c.weight for c in source.channels])):
        rows.append({"channel": channel.name, "weight": channel.weight, "share": share, f"per_{ROUND}": slots,
                     "tokens": stream.tokens, "rows": n,
                     "samples": count, "epochs": count / n})
    return {"path": str(path), "mixture": text, "max_context_width": width, "samples": samples, "channels": rows}


def text(report: dict) -> str:
    lines = [f"{report['path']}: data_mixture {report['mixture']}, rows of {report['max_context_width']:,} tokens, "
             f"over {report['samples']:,} samples"]
    width = max(len(c["channel"]) for c in report["channels"])
    for c in report["channels"]:
        lines.append(f"  {c['channel']:<{width}}  weight {c['weight']:g}: {c[f'per_{ROUND}']:,} of every {ROUND:,} "
                     f"samples; {c['samples']:,} samples of its {c['rows']:,} rows: {c['epochs']:,.2f} epochs")
    return "\n".join(lines)
