"""Hugging Face export and import: transformers loads our export and computes our logits.
Here the tests that start processes; the rest are tests/unit/test_hf_export.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from container.checkpoint.hf_export import export_hf, load_hf_weights
from tests.support.gloo import spawn
from tests.support.hf_export import SCALED, _model, _tensors


def _sharded(spec, seed: int):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model(spec, seed)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _fsdp_export_and_load(root: str) -> None:
    root = Path(root)
    for tied in (False, True):
        spec = replace(SCALED, tie_embeddings=tied)
        out = root / f"fsdp-{tied}"
        export_hf(_sharded(spec, seed=0), spec, out, dtype=torch.float32)

        # Rank 0 reads and broadcasts, or every rank reads the files itself.
        for distributed in (True, False):
            fresh = _sharded(spec, seed=1)
            load_hf_weights(fresh, root / f"plain-{tied}", distributed=distributed)
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            full = get_model_state_dict(fresh, options=options)
            if dist.get_rank() == 0:
                want = torch.load(root / f"plain-{tied}.pt")
                assert full.keys() == want.keys()
                assert all(torch.equal(full[k], want[k]) for k in want)

    # Rank 0 alone reads the files, yet every rank must raise rather than hang.
    with pytest.raises(ValueError, match="missing keys"):
        deeper = _sharded(replace(SCALED, num_layers=3), seed=0)
        load_hf_weights(deeper, root / "plain-False", distributed=True)


def test_fsdp_export_equals_unsharded_export(tmp_path):
    for tied in (False, True):
        spec = replace(SCALED, tie_embeddings=tied)
        model = _model(spec, seed=0)
        export_hf(model, spec, tmp_path / f"plain-{tied}", dtype=torch.float32)
        torch.save(model.state_dict(), tmp_path / f"plain-{tied}.pt")
    spawn(2, _fsdp_export_and_load, str(tmp_path))
    for tied in (False, True):
        plain, fsdp = tmp_path / f"plain-{tied}", tmp_path / f"fsdp-{tied}"
        assert (plain / "config.json").read_text() == (fsdp / "config.json").read_text()
        want, got = _tensors(plain), _tensors(fsdp)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
