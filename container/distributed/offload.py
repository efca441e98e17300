"""Activation offloading: what activation checkpointing keeps between forward and backward (each
block's inputs) lives in host memory, and comes back just ahead of its use.

On a GPU the copies to the host run on a side stream. In backward, when block i's recompute asks
for its inputs, the inputs of the next `horizon` blocks in backward order (i-1 ... i-horizon) are
copied back on the side stream, so at most `horizon` offloaded layers wait on the device ahead of
use (SMP's activation_loading_horizon). Tensors that are not activations (the RoPE tables, which
need no gradient) stay where they are. On CPU activations already live in host memory, so nothing
moves unless `copy_on_cpu` is set, which tests use to run the same bookkeeping without streams.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper


class _Saved:
    """One offloaded tensor: its host copy, and the device copy while it is prefetched."""

    def __init__(self, tensor: torch.Tensor, stream: torch.cuda.Stream | None):
        self.device = tensor.device
        self.on_device: torch.Tensor | None = None
        self.ready: torch.cuda.Event | None = None
        if stream is None:
            self.host = tensor.detach().clone()
            return
        self.host = torch.empty_like(tensor, device="cpu", pin_memory=True)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.host.copy_(tensor, non_blocking=True)
        tensor.record_stream(stream)  # its memory is not reused before the copy is done

    def prefetch(self, stream: torch.cuda.Stream | None) -> None:
        if self.on_device is not None:
            return
        if stream is None:
            self.on_device = self.host.clone()
            return
        with torch.cuda.stream(stream):
            self.on_device = self.host.to(self.device, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record(stream)

    def take(self, stream: torch.cuda.Stream | None) -> torch.Tensor:
        self.prefetch(stream)
        tensor, self.on_device = self.on_device, None
        if stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self.ready)
            tensor.record_stream(current)
        return tensor


class ActivationOffloader:
    """Shared by the offloaded blocks of one model; `wrap(block, index)` wraps one of them."""

    def __init__(self, horizon: int, device: torch.device, copy_on_cpu: bool = False):
        self.horizon = max(1, horizon)
        self.enabled = device.type == "cuda" or copy_on_cpu
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.saved: dict[int, list[_Saved]] = {}  # block index -> its offloaded tensors, this step
        self.prefetched: list[int] = []  # block indices in the order their prefetch was asked (tests)

    def wrap(self, block: nn.Module, index: int) -> nn.Module:
        return Offloaded(block, self, index)

    def pack(self, index: int, tensor: torch.Tensor):
        if not self.enabled or not (tensor.requires_grad or tensor.grad_fn is not None):
            return tensor
        saved = _Saved(tensor, self.stream)
        self.saved[index].append(saved)
        return saved

    def unpack(self, index: int, saved):
        if not isinstance(saved, _Saved):
            return saved
        for ahead in range(index - 1, index - 1 - self.horizon, -1):
            if ahead in self.saved and any(s.on_device is None for s in self.saved[ahead]):
                self.prefetched.append(ahead)
                for other in self.saved[ahead]:
                    other.prefetch(self.stream)
        return saved.take(self.stream)


class Offloaded(ActivationWrapper):
    """A block whose saved tensors go through the offloader. An ActivationWrapper, so state
    dicts keep the plain parameter names."""

    def __init__(self, module: nn.Module, offloader: ActivationOffloader, index: int):
        super().__init__(module)
        self.offloader, self.index = offloader, index

    def forward(self, *args, **kwargs):
        self.offloader.saved[self.index] = []  # this forward's tensors replace the last step's
        hooks = torch.autograd.graph.saved_tensors_hooks(
            lambda t: self.offloader.pack(self.index, t), lambda s: self.offloader.unpack(self.index, s))
        with hooks:
            return self._checkpoint_wrapped_module(*args, **kwargs)
