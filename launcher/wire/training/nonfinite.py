"""What a training step whose loss or gradient norm is not finite does (`nonfinite_policy`), decided
once for validation and the runtime (container/resilience/nonfinite.py; docs/faults.md).

- fail: the job fails at that step, before its update (the default).
- skip: the step applies no update: neither the optimizer nor the learning-rate schedule steps,
  and the step's batch is spent (as Megatron-LM does with a step whose gradients overflowed; torchtitan
  checks the loss and the norm at the same place, before both steps, and stops).
- rollback: the job restarts from its newest checkpoint and trains past that step's batches.
`nonfinite_max` bounds how many non-finite steps skip and rollback tolerate in the whole run.

What the two settings ask of the hyperparameters (`nonfinite_issues`): a rollback needs
checkpoints to go back to, and a bound means something only under skip or rollback. Validation
runs it for smlaunch's train.py, with the restart a rollback needs (the restart budget is the
job's: launcher.config.runtime_rules); the container runs it again before anything is built.

The batches a rollback trains past (`SkippedBatch`, the skip file): a rank whose step's loss or
gradient norm is not finite, under rollback, adds that step to `nonfinite-skips.json` in the
checkpoint directory (the first rank of each host writes it, all with the same content) and leaves
with EXIT_NONFINITE_ROLLBACK (launcher.wire.faults). The bootstrap restarts the job; the next
attempt resumes from the newest checkpoint, which is older than that step, reads this file and
trains past the samples it lists. The file lives with the checkpoints because their data positions
index the same data: a job resumed from them later skips the same samples. Positions are global
sample indices (the data loader's `next_sample`), independent of the world size. The file holds
every rollback of the run, so its length counts them towards nonfinite_max.

No torch here: the container writes the skip file with this module.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.wire.training.issues import Issue

FAIL, SKIP, ROLLBACK = "fail", "skip", "rollback"
NONFINITE_POLICIES = (FAIL, SKIP, ROLLBACK)
# A run that meets a fourth non-finite step is diverging, not meeting a bad batch now and then:
# stop and let a person look (a lower learning rate, the data) rather than skip on.
DEFAULT_NONFINITE_MAX = 3
HP = "hyperparameters"


def nonfinite_issues(hp) -> list[Issue]:
    """The issues of `hp` (TrainingHyperparameters, which read this module's choices) with its
    nonfinite_policy and nonfinite_max."""
    issues = []
    if hp.nonfinite_policy == ROLLBACK and not hp.checkpoint_freq:
        issues.append(Issue(f"{HP}.nonfinite_policy", ROLLBACK, "goes back to the newest checkpoint at a non-finite "
                            "step, but checkpoint_freq is unset, so no checkpoint is written",
                            "set checkpoint_freq: N (steps between saves), or use nonfinite_policy: skip"))
    if hp.nonfinite_max is not None and (hp.nonfinite_policy or FAIL) == FAIL:
        issues.append(Issue(f"{HP}.nonfinite_max", hp.nonfinite_max, "bounds the non-finite steps that "
                            "nonfinite_policy skip or rollback tolerate; under fail (the default) the first one "
                            "fails the job", "set nonfinite_policy: skip or rollback, or remove nonfinite_max"))
    return issues


SKIP_FILE = "nonfinite-skips.json"


@dataclass(frozen=True)
class SkippedBatch:
    step: int  # the step whose loss or gradient norm was not finite
    first_sample: int  # the global index of that step's first sample
    samples: int  # the step's global batch: samples first_sample .. first_sample + samples - 1
    attempt: int  # the attempt that met it (launcher.wire.faults.attempt)
    loss: str  # the step's loss and gradient norm, as text ("nan", "inf", "2.31")
    grad_norm: str

    def covers(self, sample: int) -> bool:
        return self.first_sample <= sample < self.first_sample + self.samples

    def text(self) -> str:
        return (f"step {self.step} (loss {self.loss}, gradient norm {self.grad_norm}): samples "
                f"{self.first_sample}..{self.first_sample + self.samples - 1}")


class SkipFileError(ValueError):
    pass


def read_skips(checkpoint_dir: Path) -> list[SkippedBatch]:
    """The rollbacks recorded in `checkpoint_dir`, oldest first; none without the file. A file
    that cannot be read is an error naming it: ignoring it would train the bad batches again."""
    path = Path(checkpoint_dir) / SKIP_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SkipFileError(f"{path} cannot be read ({exc.strerror or exc}); make it readable") from exc
    try:
        return [SkippedBatch(**entry) for entry in json.loads(text)["skipped"]]
    except (ValueError, TypeError, KeyError) as exc:
        raise SkipFileError(
            f"{path} is not a record of skipped batches ({type(exc).__name__}: {exc}); restore it, or delete it to "
            "train over the batches of the earlier rollbacks again") from exc


def write_skips(checkpoint_dir: Path, skips: list[SkippedBatch]) -> Path:
    """Atomically (a temporary file of this process, then a rename): hosts that share the
    directory write the same content, and a reader never sees half a file."""
    path = Path(checkpoint_dir) / SKIP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{SKIP_FILE}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump({"skipped": [asdict(s) for s in skips]}, f, indent=1)
            f.write("\n")
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return path
