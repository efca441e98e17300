"""Two kinds of job: smlaunch's training runtime, or a script of the user's own.

The rule (shown by `smlaunch validate`): the job runs smlaunch's runtime when its entry point
imports `container.trainer`, as `entrypoints/train.py` does. It is read from the file's text,
never guessed from its name: a user's own `train.py` is a user script. An entry point the
client cannot read (a source_dir on S3) counts as a user script.

Launcher-level rules (degrees against the world, FP8 and bf16 against the accelerator, SMP and
launcher combinations, the seed script's `fp8`, `bf16`, `max_context_width`) apply to both.
The rules that describe smlaunch's runtime (its optimizers, data set types and other choices,
its float16 and FP8 backend limits, which model it trains) apply to the runtime only; a user
script's other hyperparameters pass through as written.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import BaseModel, Field, create_model

from launcher.wire.training.base import JsonValue
from launcher.wire.training.hyperparameters import RUNTIME_CHOICES, TrainingHyperparameters

SCRIPT_READ_LIMIT = 1 << 20  # a script's imports are at its top; a bigger file is not read further
_TRAINER_IMPORT = re.compile(r"^\s*(from\s+container\.trainer\s+import|import\s+container\.trainer\b)", re.MULTILINE)


@dataclass(frozen=True)
class JobKind:
    runtime: bool  # smlaunch's training runtime; else a user script
    reason: str

    def __str__(self) -> str:
        return f"{'smlaunch runtime' if self.runtime else 'user script'} ({self.reason})"


def job_kind(entry: Path | None, entry_point: str) -> JobKind:
    """The kind of a job whose entry point is `entry` on this machine (None: not readable here)."""
    if entry is None:
        return JobKind(False, f"{entry_point} is on S3, so it is taken for a script of your own")
    try:
        text = _read_script(entry)
    except OSError:
        return JobKind(False, f"{entry} cannot be read")
    if _TRAINER_IMPORT.search(text):
        return JobKind(True, f"{entry_point} imports container.trainer")
    return JobKind(False, f"{entry_point} does not import container.trainer")


def _read_script(entry: Path) -> str:
    """The start of a regular file: a FIFO or a device named as the entry point must not block
    or stream without end (the file rules report that it is not a file)."""
    fd = os.open(entry, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{entry} is not a regular file")
        return os.read(fd, SCRIPT_READ_LIMIT).decode("utf-8", "replace")
    finally:
        os.close(fd)


@cache
def script_hyperparameters() -> type[TrainingHyperparameters]:
    """A user script's hyperparameters: typed like the runtime's, except the choices only smlaunch's
    train.py makes (optimizer, dataset_type, ...), which pass as written. Made on first use: a job
    that runs smlaunch's runtime never reads them."""
    return create_model(
        "ScriptHyperparameters", __base__=TrainingHyperparameters,
        **{name: (JsonValue, Field(None, description=TrainingHyperparameters.model_fields[name].description))
           for name in RUNTIME_CHOICES})


@cache
def for_user_scripts(model: type[BaseModel]) -> type[BaseModel]:
    """`model` (JobConfig or JobFile) with hyperparameters read as a user script's."""
    hyperparameters = script_hyperparameters()
    return create_model(f"Script{model.__name__}", __base__=model, hyperparameters=(
        hyperparameters, Field(default_factory=hyperparameters, description="Arguments for the training script.")))
