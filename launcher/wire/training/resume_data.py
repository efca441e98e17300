"""What a resume makes of data that changed since its checkpoint was saved (the records of
launcher.wire.data_streams), decided here once: the runtime applies it before it loads a
checkpoint, `smlaunch validate` where it sees the checkpoint and the channels on this machine.

- Another tokenizer (vocabulary digest or size) on an indexed channel is refused: the same ids
  mean other tokens, so neither the model's training nor the data position carries over.
- Another set of shards or files is a warning naming what changed and what it does to the order
  (container.data.order: sample k of a channel is its row k mod rows, shuffled by
  Permutation(rows, seed, epoch), a function of the number of rows). Appending data is a use:
  growing a corpus as it is collected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_FRESH = ("resume on the data the checkpoint was trained on, or start a new run in an empty checkpoint directory "
          "(checkpoint_dir; on SageMaker another checkpoint_s3_uri, in a local job another checkpoint_local_path)")
_ROWS_KEPT = "the rows of the data already there stay the same rows (the new tokens come after them)"
SHUFFLED_APPENDED = (
    f"{_ROWS_KEPT}, but the shuffle is a permutation of the channel's rows that depends on how many there are, so "
    "from its data position on the run follows another order: in the current epoch some rows it already trained "
    "come again and some it had not reached are left out of the epoch; the new rows are drawn among the rest, and "
    "every later epoch is a whole permutation of all the rows")
IN_ORDER_APPENDED = (
    f"{_ROWS_KEPT}; read in order, sample k is row k mod the number of rows: within the first epoch the run goes "
    "on where it stopped and reaches the new rows after the old ones, past it the position falls elsewhere in the "
    "data (rows are trained again or skipped until the epoch ends)")
REPLACED = ("from the first changed one on, the rows may hold other tokens, so the data position no longer says "
            "what was trained: rows already trained may come again and others be skipped")
REPACKED = ("chat examples are packed into rows from the whole channel, so every row may now hold other examples: "
            "rows already trained may come again and others be skipped")


@dataclass(frozen=True)
class Change:
    channel: str
    problem: str
    then: str  # a refusal's fix; a warning's consequence for the order

    def __str__(self) -> str:
        return f"{self.problem}; {self.then}"


@dataclass
class DataChanges:
    refusals: list[Change] = field(default_factory=list)  # the resume would train on other tokens
    warnings: list[Change] = field(default_factory=list)  # it trains on, and the order is not the saved one's


def compare(saved: dict, now: dict) -> DataChanges:
    """What changed from the data `saved` (a checkpoint's record) to `now`, channel by channel.
    Channels in only one of them, or read in another format, are the data stream's difference,
    which the checkpoint's `keeps` refuse (launcher.wire.training.resume)."""
    changes = DataChanges()
    if saved.get("dataset_type") != now["dataset_type"]:
        return changes
    for name, was in saved["channels"].items():
        new = now["channels"].get(name)
        if new is None:
            continue
        if "shards" in was:
            if _tokenizer_key(was) != _tokenizer_key(new):
                changes.refusals.append(Change(
                    name, f"channel {name} was packed with {_tokenizer(was)} when the checkpoint was saved, and is "
                    f"now packed with {_tokenizer(new)}: the same token ids mean other tokens, so neither the "
                    "trained model nor the data position carries over", _FRESH))
                continue
            difference = _difference(was["shards"], new["shards"], "shard")
        else:
            difference = _difference(was["files"], new["files"], "file")
        if difference is not None:
            what, appended = difference
            changes.warnings.append(Change(name, f"channel {name} changed since the checkpoint was saved: {what}",
                                           _consequence(now, appended)))
    return changes


def _tokenizer_key(channel: dict) -> tuple:
    # the digest of the vocabulary (None: UTF-8 bytes) and its size; the name is only a label
    return channel["tokenizer"].get("vocabulary_sha256"), channel["vocab_size"]


def _tokenizer(channel: dict) -> str:
    digest = channel["tokenizer"].get("vocabulary_sha256")
    what = f", vocabulary sha256 {digest[:16]}..." if digest else ""
    return f"{channel['tokenizer'].get('name')} (vocab_size {channel['vocab_size']}{what})"


def _difference(was: list[dict], now: list[dict], unit: str) -> tuple[str, bool] | None:
    """What changed in a channel's list of shards or files, and whether it was only appended to
    (the saved entries, unchanged, are the first ones read now); None when nothing did."""
    if was == now:
        return None
    old, new = {e["name"]: e for e in was}, {e["name"]: e for e in now}
    parts = []
    for label, names in (("added", [n for n in new if n not in old]), ("removed", [n for n in old if n not in new]),
                         ("changed in size", [n for n in old if n in new and old[n] != new[n]])):
        if names:
            parts.append(f"{len(names)} {unit}(s) {label} ({_some(names)})")
    if not parts:  # the same entries, read in another order
        parts.append(f"its {unit}s are read in another order")
    tokens = (f", {sum(e['tokens'] for e in was):,} -> {sum(e['tokens'] for e in now):,} tokens"
              if unit == "shard" else f", {sum(e['bytes'] for e in was):,} -> {sum(e['bytes'] for e in now):,} bytes")
    return f"{', '.join(parts)}: {len(was)} -> {len(now)} {unit}s{tokens}", now[:len(was)] == was


def _some(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _consequence(now: dict, appended: bool) -> str:
    if now["dataset_type"] == "chat":
        return REPACKED
    if not appended:
        return REPLACED
    return SHUFFLED_APPENDED if now["shuffled"] else IN_ORDER_APPENDED
