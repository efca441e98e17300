"""What the unit and integration tests of plan_memory share (tests/{unit,integration}/test_plan_memory.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from launcher.config.jobfile import validate_job_file
from launcher.plan.workload import workload_of
from launcher.wire.training.layout import ParallelLayout
from launcher.wire.training.models import PRESETS

ROOT = Path(__file__).resolve().parents[2]


SEED = ROOT / "configs" / "seed"


# The seed's own loss: cross-entropy on the whole fp32 logits (smlaunch's runtime chunks it by default).
WHOLE_LOGITS = "hyperparameters.loss_chunk_tokens=0"


def seed(name: str, *overrides: str):
    return validate_job_file(SEED / f"{name}.yaml", list(overrides))


BASE = workload_of(seed("p5-cp8-bf16"))


def workload(preset: str, seq: int, batch: int, cp: int, group: int, ac: str | None, world: int = 8):
    layout = ParallelLayout(world=world, dp_replicate=world // group, dp_shard=group // cp, cp=cp, tp=1)
    return replace(BASE, spec=PRESETS[preset], seq_len=seq, micro_batch=batch, layout=layout, ac_mode=ac)
