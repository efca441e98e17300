"""Tensor parallelism at module level: a TP-sharded model computes the unsharded model's logits
and gradients, and exports and loads Hugging Face weights as the full model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from container.checkpoint.hf_export import export_hf, load_hf_weights
from container.distributed.tensor_parallel import apply_tp, check_tp_degree, loss_context
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS
from tests.support.close import assert_close, llama_terms
from tests.support.gloo import spawn

SEQ = 32
TINY = PRESETS["llama3-tiny"]  # 4 heads, 2 key/value heads: tp 2 at most


def _model(spec, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(spec, SEQ)
    model.init_weights()
    return model


def _full(tensor):
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _loss_and_grads(model, tokens, labels, tp: int):
    with loss_context(tp):
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        loss.backward()
    return _full(logits.detach()), _full(loss.detach()), {n: _full(p.grad) for n, p in model.named_parameters()}


def _tp_matches_unsharded(root: str) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, TINY.vocab_size, (2, SEQ + 1), generator=gen)  # the same on every rank
    for tied in (False, True):
        spec = replace(TINY, tie_embeddings=tied)
        reference, sharded = _model(spec), _model(spec)
        apply_tp(sharded, mesh["tp"])
        assert sharded.layers["0"].attention.wq.weight.placements == (Shard(0),)
        assert sharded.layers["0"].feed_forward.w2.weight.placements == (Shard(1),)
        assert sharded.norm.weight.placements == (Replicate(),)
        assert (sharded.output.weight is sharded.tok_embeddings.weight) is tied

        assert sharded.output.weight.placements == (Shard(0),)  # logits split by vocabulary

        want_logits, want_loss, want = _loss_and_grads(reference, tokens[:, :-1], tokens[:, 1:], 1)
        got_logits, got_loss, got = _loss_and_grads(sharded, tokens[:, :-1], tokens[:, 1:], 2)
        assert got_logits.shape == want_logits.shape
        terms = llama_terms(TINY, SEQ, tokens[:, 1:].numel())  # each at its whole tensor's scale
        assert_close(got_logits, want_logits, terms=terms, what="logits")
        assert_close(got_loss, want_loss, terms=terms, what="loss")
        assert got.keys() == want.keys()
        for name in want:
            assert_close(got[name], want[name], terms=terms, what=name)

        # export gathers the full weights; loading scatters them into a fresh TP model
        out = Path(root) / f"tp-{tied}"
        export_hf(sharded, spec, out, dtype=torch.float32)
        fresh = _model(spec, seed=1)
        apply_tp(fresh, mesh["tp"])
        load_hf_weights(fresh, Path(root) / f"plain-{tied}", distributed=True)
        for name, param in fresh.state_dict().items():
            assert torch.equal(param.full_tensor(), reference.state_dict()[name]), name


def test_tp_model_matches_unsharded_and_exports_full_weights(tmp_path):
    for tied in (False, True):
        spec = replace(TINY, tie_embeddings=tied)
        export_hf(_model(spec), spec, tmp_path / f"plain-{tied}", dtype=torch.float32)
    spawn(2, _tp_matches_unsharded, str(tmp_path))
    for tied in (False, True):
        plain, tp = (load_file(tmp_path / f"{kind}-{tied}" / "model.safetensors") for kind in ("plain", "tp"))
        assert tp.keys() == plain.keys() and all(torch.equal(tp[k], plain[k]) for k in plain)
        assert (tmp_path / f"tp-{tied}" / "config.json").read_text() == \
            (tmp_path / f"plain-{tied}" / "config.json").read_text()


def test_uneven_splits_are_refused_by_name():
    model = build_model(replace(TINY, num_kv_heads=1), 33, device="meta")
    with pytest.raises(ValueError, match="degree 2 must divide the model's 1 key/value heads, "
                                         r"33 sequence length \(max_context_width\)"):
        check_tp_degree(model, 2)
    check_tp_degree(build_model(TINY, SEQ, device="meta"), 2)
