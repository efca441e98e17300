"""What the unit and integration tests of hf_export share (tests/{unit,integration}/test_hf_export.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from container.models.llama import build_model
from launcher.wire.training.models import PRESETS

# Original context 64 with head_dim 16: one frequency is smoothed, six are divided by 8.
SCALED = replace(
    PRESETS["llama3-tiny"], rope_scaling=(8.0, 1.0, 4.0, 64), max_position_embeddings=256
)


SEQ = 128


def _model(spec, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(spec, SEQ)
    model.init_weights()
    return model


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors
