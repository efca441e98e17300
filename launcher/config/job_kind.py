"""Two kinds of job: smlaunch's training runtime, or a script of the user's own.

The rule (shown by `smlaunch validate`; launcher.wire.runtime_script, which the bootstrap reads
too): the job runs smlaunch's runtime when its entry point imports `container.trainer`. An entry
point the client cannot read (a source_dir on S3) counts as a user script.

Launcher-level rules (degrees against the world, FP8 and bf16 against the accelerator, SMP and
launcher combinations, the seed script's `fp8`, `bf16`, `max_context_width`) apply to both.
The rules that describe smlaunch's runtime (its optimizers, data set types and other choices,
its float16 and FP8 backend limits, which model it trains) apply to the runtime only; a user
script's other hyperparameters pass through as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import BaseModel, Field, create_model

from launcher.wire.runtime_script import imports_trainer, read_start
from launcher.wire.training.base import JsonValue
from launcher.wire.training.hyperparameters import RUNTIME_CHOICES, TrainingHyperparameters


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
        text = read_start(entry)
    except OSError:
        return JobKind(False, f"{entry} cannot be read")
    if imports_trainer(text):
        return JobKind(True, f"{entry_point} imports container.trainer")
    return JobKind(False, f"{entry_point} does not import container.trainer")


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
