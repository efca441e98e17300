"""Delayed init (the model built on the meta device, then given rank 0's eager initialisation)
builds the same model as eager init: the same parameters, the same values, tied embeddings
still tied. One process, fp32 (no FSDP: `to_empty` on a plain module gives each module its own
tensor) and bf16 (FSDP2 on a one-rank mesh).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import DTensor

from tests.support.gloo import spawn

SEQ = 32


def _build(delayed: bool, bf16: bool, tied: bool):
    from container import trainer
    from container.args import parse_args
    from container.distributed.runtime import distribution_parameters, init_runtime
    from launcher.wire.training.models import PRESETS

    hp, _, _ = parse_args(["--model_preset", "llama3-tiny", "--dataset_type", "synthetic",
                           "--max_context_width", str(SEQ), "--bf16", str(int(bf16)),
                           "--delayed_param", str(int(delayed))])
    rt = init_runtime(distribution_parameters({}))
    s = trainer.settings(rt, hp)
    assert s.delayed_init is delayed and s.fsdp is bf16
    return trainer.build_parallel_model(rt, replace(PRESETS["llama3-tiny"], tie_embeddings=tied), s)


def _values(model) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def _compare(root: str) -> None:
    _, dtype, tie = root.rsplit("/", 1)[-1].split("-")  # run-<fp32|bf16>-<tied|untied>
    bf16, tied = dtype == "bf16", tie == "tied"
    eager, delayed = _build(False, bf16, tied), _build(True, bf16, tied)
    assert (delayed.output.weight is delayed.tok_embeddings.weight) is tied
    assert delayed.num_params(exclude_embedding=False) == eager.num_params(exclude_embedding=False)
    eager_values, delayed_values = _values(eager), _values(delayed)
    assert eager_values.keys() == delayed_values.keys()
    for key, value in eager_values.items():
        assert torch.equal(value, delayed_values[key]), key


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_delayed_init_builds_the_eager_model(tmp_path, bf16, tied):
    root = tmp_path / f"run-{'bf16' if bf16 else 'fp32'}-{'tied' if tied else 'untied'}"
    root.mkdir()
    spawn(1, _compare, str(root))
