"""train.py's arguments: the seed script's names, typed by the client's own model.

The sagemaker-training toolkit passes hyperparameters as `--key value` (bools as True/False,
dicts as k=v,k2=v2); scripts must tolerate keys they do not know. Directories come from
arguments, else the SM_* variables, else the /opt/ml layout under SAGEMAKER_BASE_DIR.
An argument that names a place under /opt/ml (the seed passes `--checkpoint_dir
/opt/ml/checkpoints`) follows the tree when SAGEMAKER_BASE_DIR moves it (local mode), and the
checkpoint directory follows SMLAUNCH_CHECKPOINT_DIR (shared by a local job's hosts).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from container.tensorboard import configured_local_path
from launcher.wire.datafiles import TRAIN_CHANNELS, VALIDATION_CHANNELS
from launcher.wire.training.hyperparameters import DIRECTORY_ARGUMENTS as DIRECTORY_ARGS
from launcher.wire.training.hyperparameters import TrainingHyperparameters

OPT_ML = Path("/opt/ml")


def parse_pairs(argv: list[str]) -> dict[str, str]:
    """`--key value`, `--key=value` and bare `--flag` (true) into a dict; positionals ignored."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--") and len(token) > 2:
            key, eq, value = token[2:].partition("=")
            key = key.replace("-", "_")
            if eq:
                out[key] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[key] = argv[i + 1]
                i += 1
            else:
                out[key] = "true"
        i += 1
    return out


@dataclass
class Directories:
    model: Path
    output_data: Path
    checkpoints: Path
    train: Path | None
    validation: Path | None
    tensorboard: Path | None = None  # where rank 0 writes TensorBoard scalars; None: nowhere


def directories(pairs: dict[str, str]) -> Directories:
    base = Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"))
    env = os.environ

    def channel(*names: str) -> Path | None:
        for name in names:
            if env.get(f"SM_CHANNEL_{name.upper()}"):
                return Path(env[f"SM_CHANNEL_{name.upper()}"])
        return None

    def moved(value: str) -> Path:
        path = Path(value)
        if not path.is_relative_to(OPT_ML):
            return path
        rel = path.relative_to(OPT_ML)
        if env.get("SMLAUNCH_CHECKPOINT_DIR") and rel.parts[:1] == ("checkpoints",):
            return Path(env["SMLAUNCH_CHECKPOINT_DIR"]).joinpath(*rel.parts[1:])
        return base / rel

    def pick(arg: str, *fallbacks) -> Path | None:
        if pairs.get(arg):
            return moved(pairs[arg])
        return next((Path(f) for f in fallbacks if f), None)

    return Directories(
        model=pick("model_dir", env.get("SM_MODEL_DIR"), base / "model"),
        output_data=pick("output_data_dir", env.get("SM_OUTPUT_DATA_DIR"), base / "output" / "data"),
        checkpoints=pick("checkpoint_dir", env.get("SMLAUNCH_CHECKPOINT_DIR"), base / "checkpoints"),
        train=pick("training_dir", channel(*TRAIN_CHANNELS)),
        validation=pick("test_dir", channel(*VALIDATION_CHANNELS)),
        tensorboard=moved(pairs["tensorboard_dir"]) if pairs.get("tensorboard_dir") else _configured_tensorboard(
            base, moved),
    )


def channels() -> dict[str, Path]:
    """The job's input channels in this container (SM_CHANNELS, else the SM_CHANNEL_* variables)."""
    names = json.loads(os.environ.get("SM_CHANNELS") or "[]") or [
        key.removeprefix("SM_CHANNEL_").lower() for key in os.environ if key.startswith("SM_CHANNEL_")]
    base = Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")) / "input" / "data"
    return {name: Path(os.environ.get(f"SM_CHANNEL_{name.upper()}") or base / name) for name in names}


def _configured_tensorboard(base: Path, moved) -> Path | None:
    """The LocalPath of the job's TensorBoardOutputConfig (container.tensorboard), in this tree."""
    local_path = configured_local_path(base / "input" / "config")
    return moved(local_path) if local_path else None


def parse_args(argv: list[str]) -> tuple[TrainingHyperparameters, Directories, dict[str, str]]:
    pairs = parse_pairs(argv)
    known = {k: v for k, v in pairs.items() if k not in DIRECTORY_ARGS}
    return TrainingHyperparameters.model_validate(known), directories(pairs), pairs
