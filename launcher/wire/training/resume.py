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
- the optimizer (its moments are in the checkpoint).

The runtime records `RunIdentity.record()` in every checkpoint (container/checkpoint/checkpointer.py) and
refuses to continue one whose record differs (`RunIdentity.conflicts`); validation explains the same
rule before a job that resumes is submitted (resume_rules.py). No torch here: the container
imports this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from launcher.wire.training import data_order
from launcher.wire.training.degrees import DEGREES
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
    # the embedding's and head's rows: the vocabulary, padded where tensor parallelism cannot split
    # it (launcher.wire.training.models.vocab_rows); a resume keeps the saved rows wherever its degree splits them
    Kept("vocab_rows", "vocabulary rows (padded for tensor parallelism)", "tensor_parallel_degree", noted=False),
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
            **({"vocab_rows": self.vocab_rows} if self.vocab_rows is not None else {}),
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
            was, new = saved[kept.key], now[kept.key]
            if kept.key == "model":  # field by field: a field added since the save is not compared
                was, new = _model_difference(was, new)
                if not was:
                    continue
            elif was == new:
                continue
            elif kept.key == "global_batch":
                new = batch_text(self.settings, self.data_parallel)
            lines.append(f"{_named(kept)} was {was} when saved, now {new}; "
                         f"{_fix(kept, saved[kept.key], self.data_parallel)}")
        return lines


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
    if kept.key == "vocab_rows":
        return f"resume with a tensor_parallel_degree that divides {saved}"
    return f"set {kept.settings} back to {saved}"


def _model_difference(was: dict, now: dict) -> tuple[str, str]:
    keys = [k for k in was if k in now and was[k] != now[k]]  # each side names only these
    return (", ".join(f"{k} {was[k]}" for k in keys), ", ".join(f"{k} {now[k]}" for k in keys))
