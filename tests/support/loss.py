"""What the unit and integration tests of loss share (tests/{unit,integration}/test_loss.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from container.data.loader import IGNORE_INDEX, shift_labels
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS
from tests.support.close import assert_close, llama_terms

SEQ, BATCH = 64, 3  # 192 tokens: no dimension of the model is that long, nor the vocabulary's 256
TINY = PRESETS["llama3-tiny"]


TERMS = llama_terms(TINY, SEQ, BATCH * SEQ)  # for tolerances: tests/support/close.py


def _model(spec=TINY, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(spec, SEQ)
    model.init_weights()
    return model


def _batch() -> dict:
    tokens = torch.randint(0, TINY.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = shift_labels(tokens)
    labels[0, :20] = IGNORE_INDEX  # padding: the first 16-token chunk has no label at all
    return {"input_ids": tokens, "labels": labels}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _reference(model, batch) -> tuple[torch.Tensor, dict]:
    """The whole-logits loss, independently of container.loss, and its gradients."""
    logits = model(batch["input_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")
    loss.backward()
    return loss.detach(), _grads(model)


def _grads(model) -> dict:
    grads = {name: _full(p.grad).clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def _assert_close(got_loss, got, want_loss, want) -> None:
    """The loss and every gradient, each at its whole tensor's scale: the chunks (and tp's shards)
    add the same numbers in other orders."""
    assert_close(got_loss, want_loss, terms=TERMS, what="loss")
    assert got.keys() == want.keys()
    for name in want:
        assert_close(got[name], want[name], terms=TERMS, what=name)


class LargestLogits(TorchDispatchMode):
    """The most token rows of any [tokens..., vocabulary] tensor an operation produced: logits,
    log-probabilities and their gradients (the head's weight, transposed to [hidden, vocabulary]
    in its matmul, is left out; DTensors count by their global shape)."""

    def __init__(self, spec=TINY):
        super().__init__()
        self.vocab, self.hidden, self.most = spec.vocab_size, spec.hidden_size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                rows = t.numel() // self.vocab
                self.most = max(self.most, rows if rows != self.hidden else 0)
        return out
