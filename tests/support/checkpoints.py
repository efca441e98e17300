"""Checkpoints made in one process (or on a gloo mesh), for tests of what is saved and verified."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from container.models.llama import build_model
from launcher.config.models import PRESETS

SPEC = replace(PRESETS["llama3-tiny"], max_position_embeddings=32)
SEQ = 16


def _warmup(step: int) -> float:
    return min(1.0, (step + 1) / 4)


def make_model(seed: int, mesh=None, spec=SPEC):
    torch.manual_seed(seed)
    model = build_model(spec, SEQ)
    model.init_weights()
    if mesh is not None:
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup)


def train_step(model, optimizer, scheduler, step: int) -> None:
    # The same batch on every rank: FSDP's averaged gradient then equals the single-process one.
    generator = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, SPEC.vocab_size, (2, SEQ + 1), generator=generator)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
