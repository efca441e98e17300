"""What a resume from a checkpoint may change and what it must keep, decided here once.

A checkpoint may be resumed by a job of another world size: DCP reshards the model and optimizer
states onto the new layout, and the data position is the global index of the next step's first
sample (container/data/loader.py), which no degree changes. So the fleet and the parallel degrees may
change. What the data position and the optimizer state only mean together with, may not:

- the global batch in sequences (train_batch_size x data-parallel degree x
  gradient_accumulation_steps): steps and the data position are counted in it;
- the sequence length, and the data stream (dataset_type; the seed, which makes synthetic data
  and shuffles indexed shards and chat rows; the shuffle and the mixture of indexed channels;
  the truncation of chat examples, which decides the rows they are packed into);
- the model's shape (a smaller model would load part of the weights without complaint);
- the optimizer (its moments are in the checkpoint);
- the LoRA adapters: trained or not, their rank, alpha, scaling, targets and the modules trained whole
  (the checkpoint holds those parameters and their moments, and only those);
- the base a LoRA run's adapters were trained on, by its weights' digest (QLoRA's checkpoint does not
  hold the base, LoRA's holds it but a resume on another base would still not train what was asked).

The runtime records `RunIdentity.record()` in every checkpoint (container/checkpoint/checkpointer.py) and
refuses to continue one whose record differs (`RunIdentity.conflicts`); validation explains the same
rule before a job that resumes is submitted (resume_rules.py). No torch here: the container
imports this module.

What a resume makes of data that changed since its checkpoint was saved (`compare` of the records
of launcher.wire.checkpoints): the runtime applies it before it loads a checkpoint, `smlaunch
validate` where it sees the checkpoint and the channels on this machine.

- Another tokenizer (vocabulary digest or size) on an indexed channel is refused: the same ids
  mean other tokens, so neither the model's training nor the data position carries over.
- Another set of shards or files is a warning naming what changed and what it does to the order
  (container.data.order: sample k of a channel is its row k mod rows, shuffled by
  Permutation(rows, seed, epoch), a function of the number of rows). Appending data is a use:
  growing a corpus as it is collected.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.wire.training import data_order
from launcher.wire.training.degrees import DEGREES
from launcher.wire.training.lora import LoraSettings
from launcher.wire.training.models import ModelSpec
from launcher.wire.training.run_settings import RunSettings

# The degrees a resume may change: checkpoints name parameters by their global names and DCP
# reshards them onto every layout these make (tests/integration/test_resume_world_size.py, and the resume
# tests of test_train_tp.py, test_train_pp.py, test_train_moe.py). A parallelism joins this list
# once its checkpoints are shown to reshard (Degree.resharded); the runtime's error and the
# validator's note name it.
PARALLEL_DEGREES = tuple(d.key for d in DEGREES if d.resharded)
FLEET = ("instance_count", "processes_per_host")

# ModelSpec fields that do not shape the trained model (names, special tokens, the initialisation).
_NOT_SHAPE = ("name", "bos_token_id", "eos_token_id", "pad_token_id", "unsupported", "initializer_range")


@dataclass(frozen=True)
class Kept:
    """One thing a resume must keep: its key in the record, how messages name it, its settings."""

    key: str
    label: str
    settings: str
    noted: bool = True  # in validate's resume note: what a user must keep (not what the runtime keeps itself)


KEPT = (
    Kept("global_batch", "global batch in sequences per step",
         "train_batch_size x data-parallel degree x gradient_accumulation_steps"),
    Kept("sequence_length", "sequence length", "max_context_width"),
    Kept("data_stream", "data stream", "dataset_type, seed, shuffle, data_mixture and truncation_mode"),
    Kept("model", "model shape", "model_preset or the model's config"),
    Kept("optimizer", "optimizer", "optimizer"),
    # not in validate's note, which every resuming job prints: the runtime refuses other adapters by name
    Kept("adapters", "LoRA adapters",
         "use_peft, lora_r, lora_alpha, use_rslora, lora_target_modules and lora_modules_to_save", noted=False),
    # the embedding's and head's rows: the vocabulary, padded where tensor parallelism cannot split
    # it (launcher.wire.training.models.vocab_rows); a resume keeps the saved rows wherever its degree splits them
    Kept("vocab_rows", "vocabulary rows (padded for tensor parallelism)", "tensor_parallel_degree", noted=False),
    Kept("base", "base model", "hf_pretrained_model_name_or_dir and its weights", noted=False),
)


def may_change() -> str:
    """What a resume may change, for messages."""
    return ", ".join(("the world size", *FLEET, *PARALLEL_DEGREES))


def global_batch(s: RunSettings, data_parallel: int) -> int:
    """Sequences per optimizer step over every data-parallel rank."""
    return s.micro_batch * data_parallel * s.grad_accum


def batch_text(s: RunSettings, data_parallel: int) -> str:
    return (f"{global_batch(s, data_parallel)} = train_batch_size {s.micro_batch} x data-parallel degree "
            f"{data_parallel} x gradient_accumulation_steps {s.grad_accum}")


def data_stream(s: RunSettings) -> str:
    """The sample sequence the data position indexes: synthetic data is made from the seed,
    indexed shards are shuffled with it and mixed by weight, chat rows are shuffled with it and
    packed from what truncation keeps."""
    if s.dataset_type == "synthetic":
        return f"synthetic, seed {s.seed}"
    return data_order.describe(s.dataset_type, s.shuffle, s.seed, s.data_mixture, s.truncation_mode)


@dataclass(frozen=True)
class RunIdentity:
    """This run's values of what a resume must keep (KEPT)."""

    settings: RunSettings
    model: ModelSpec
    data_parallel: int
    vocab_rows: int | None = None  # None: not recorded (nor compared)
    adapters: LoraSettings | None = None  # the LoRA adapters trained on a frozen base; None: the whole model
    base: dict | None = None  # what identifies that base (container.checkpoint.pretrained); None: not recorded

    def record(self) -> dict[str, Any]:
        """What a checkpoint records, keyed as in KEPT: plain values (torch.load's weights_only
        reads them)."""
        s = self.settings
        return {
            "global_batch": global_batch(s, self.data_parallel),
            "sequence_length": s.seq_len,
            "data_stream": data_stream(s),
            "model": {k: v for k, v in asdict(self.model).items() if k not in _NOT_SHAPE},
            "optimizer": s.optimizer,
            "adapters": adapters_text(self.adapters),
            **({"vocab_rows": self.vocab_rows} if self.vocab_rows is not None else {}),
            **({"base": self.base} if self.base is not None else {}),
        }

    def conflicts(self, saved: dict[str, Any]) -> list[str]:
        """Why this run may not continue a checkpoint that recorded `saved`, one line each (empty:
        it may). Only what `saved` records is compared: a record written before a key existed
        does not hold it, and asks nothing of it."""
        now = self.record()
        lines = []
        for kept in KEPT:
            if kept.key not in saved or kept.key not in now:
                continue
            difference = self._difference(kept.key, saved[kept.key], now[kept.key])
            if difference is not None:
                was, new = difference
                lines.append(f"{_named(kept)} was {was} when saved, now {new}; "
                             f"{_fix(kept, saved[kept.key], self.data_parallel)}")
        return lines

    def _difference(self, key: str, was: Any, new: Any) -> tuple[Any, Any] | None:
        """How the saved and the current value of `key` read in a message where they differ; None where not."""
        if key == "model":  # field by field: a field added since the save is not compared
            was, new = _model_difference(was, new)
            return (was, new) if was else None
        if key == "base":  # by the weights: the same files moved, or a channel mounted elsewhere, are the same base
            return None if _base_key(was) == _base_key(new) else (base_text(was), base_text(new))
        if was == new:
            return None
        return was, batch_text(self.settings, self.data_parallel) if key == "global_batch" else new


def adapters_text(lora: LoraSettings | None) -> str:
    """What a checkpoint records of its adapters (dropout and merging change nothing it holds)."""
    if lora is None:
        return "none (the whole model trains)"
    saved = f", {', '.join(lora.modules_to_save)} whole" if lora.modules_to_save else ""
    return (f"r {lora.r}, alpha {lora.alpha}{' (rsLoRA)' if lora.rslora else ''} on {','.join(lora.targets)}"
            f"{saved}{', an NF4 base (load_in_4bit)' if lora.nf4 else ''}")


def base_text(base: dict) -> str:
    """A base as messages name it: its source, Hub commit and weights' digest."""
    commit = f" (commit {base['revision']})" if base.get("revision") else ""
    digest = f", weights sha256 {base['weights_sha256'][:16]}..." if base.get("weights_sha256") else ""
    return f"{base['model']}{commit}{digest}"


def _base_key(base: dict) -> str:
    # the weights' digest; random weights have none, and their source names the seed that drew them
    return base.get("weights_sha256") or base["model"]


def batch_fix(saved_batch: int, data_parallel: int) -> str:
    """How to keep a global batch of `saved_batch` sequences at `data_parallel` data-parallel ranks."""
    if saved_batch % data_parallel:
        return (f"{saved_batch} sequences do not split over {data_parallel} data-parallel ranks: use a "
                f"data-parallel degree that divides {saved_batch}")
    per_rank = saved_batch // data_parallel
    return (f"set train_batch_size x gradient_accumulation_steps = {per_rank} (e.g. train_batch_size "
            f"{per_rank}, gradient_accumulation_steps 1)")


def _named(kept: Kept) -> str:
    """The label, with the settings behind it where the message does not show them otherwise."""
    return kept.label if kept.settings == kept.label or kept.key == "global_batch" else (
        f"{kept.label} ({kept.settings})")


def _fix(kept: Kept, saved: Any, data_parallel: int) -> str:
    if kept.key == "global_batch":
        return batch_fix(saved, data_parallel)
    if kept.key == "model":
        return "train the model the checkpoint holds"
    if kept.key == "adapters":
        return "train the adapters the checkpoint holds, or start a new run in an empty checkpoint directory"
    if kept.key == "base":
        return ("resume on the base the checkpoint was trained on (hf_pretrained_model_name_or_dir naming the same "
                "weights), or start a new run in an empty checkpoint directory")
    if kept.key == "vocab_rows":
        return f"resume with a tensor_parallel_degree that divides {saved}"
    return f"set {kept.settings} back to {saved}"


def _model_difference(was: dict, now: dict) -> tuple[str, str]:
    keys = [k for k in was if k in now and was[k] != now[k]]  # each side names only these
    return (", ".join(f"{k} {was[k]}" for k in keys), ", ".join(f"{k} {now[k]}" for k in keys))


# --- what a resume makes of changed data --------------------------------------------------------

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
            # a Megatron corpus's tokenizer is the job's, which validate may not see (null: not compared)
            known = was.get("tokenizer") is not None and new.get("tokenizer") is not None
            if known and _tokenizer_key(was) != _tokenizer_key(new):
                how = "read as tokens of" if "format" in was else "packed with"
                changes.refusals.append(Change(
                    name, f"channel {name} was {how} {_tokenizer(was)} when the checkpoint was saved, and is "
                    f"now {how} {_tokenizer(new)}: the same token ids mean other tokens, so neither the "
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
    digest, size = channel["tokenizer"].get("vocabulary_sha256"), channel["vocab_size"]
    parts = ([f"vocab_size {size}"] if size is not None else []) + (
        [f"vocabulary sha256 {digest[:16]}..."] if digest else [])
    name = channel["tokenizer"].get("name")
    return f"{name} ({', '.join(parts)})" if parts else name


def _difference(was: list[dict], now: list[dict], unit: str) -> tuple[str, bool] | None:
    """What changed in a channel's list of shards or files, and whether it was only appended to
    (the saved entries, unchanged, are the first ones read now); None when nothing did."""
    if was == now:
        return None
    old, new = {e["name"]: e for e in was}, {e["name"]: e for e in now}
    parts = []
    for label, names in (("added", [n for n in new if n not in old]), ("removed", [n for n in old if n not in new]),
                         ("changed in size", [n for n in old if n in new and _size(old[n]) != _size(new[n])]),
                         ("changed in content", [n for n in old if n in new and old[n] != new[n]
                                                 and _size(old[n]) == _size(new[n])])):
        if names:
            parts.append(f"{len(names)} {unit}(s) {label} ({_some(names)})")
    if not parts:  # the same entries, read in another order
        parts.append(f"its {unit}s are read in another order")
    tokens = (f", {sum(e['tokens'] for e in was):,} -> {sum(e['tokens'] for e in now):,} tokens"
              if unit == "shard" else f", {sum(e['bytes'] for e in was):,} -> {sum(e['bytes'] for e in now):,} bytes")
    return f"{', '.join(parts)}: {len(was)} -> {len(now)} {unit}s{tokens}", now[:len(was)] == was


def _size(entry: dict) -> dict:
    return {key: value for key, value in entry.items() if key != "fingerprint"}


def _some(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _consequence(now: dict, appended: bool) -> str:
    if now["dataset_type"] == "chat":
        return REPACKED
    if not appended:
        return REPLACED
    return SHUFFLED_APPENDED if now["shuffled"] else IN_ORDER_APPENDED
