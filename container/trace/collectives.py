"""The collectives a traced step issues, counted where torch dispatches them.

FSDP2's all-gathers and reduce-scatters and the loss's all-reduces are c10d ops
(`torch.ops.c10d.*`, which take the ProcessGroup); DTensor's (tensor parallelism) and context
parallelism's are functional collectives (`torch.ops._c10d_functional.*`, which take the group's
name). torch's CommDebugMode sees both but counts ops only; this mode keeps the same op sets
(torch.distributed.tensor.debug._comm_mode) and adds the group and the bytes. A group is named by
the runtime's mesh dimension or flattened view ("dp_shard_cp", "tp", ...; a view of the whole world
is the default group, named by the view; one carved from it later by the dimension it was made
for). Bytes are what the rank passes
in: an all-gather's shard, a reduce-scatter's whole input.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug._comm_mode import NATIVE_TO_PY_MAPPING, c10d_collective_ops
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from container.distributed.runtime import Runtime
from launcher.wire.training.layout import ParallelLayout

# CommDebugMode's collectives, and the pipeline's point-to-point transfers
_COLLECTIVES = (set(c10d_collective_ops) | set(NATIVE_TO_PY_MAPPING)
                | {torch.ops.c10d.send, torch.ops.c10d.recv_})


def group_names(rt: Runtime) -> dict[str, str]:
    """A process group's name -> the mesh dimension(s) it spans; the world's is "world"."""
    names = {}
    for dim in ParallelLayout.mesh_dim_names:
        names.setdefault(rt.mesh.get_group(dim).group_name, dim)
    for view, mesh in rt.flat.items():
        names.setdefault(mesh.get_group().group_name, view)
    names.setdefault(dist.group.WORLD.group_name, "world")
    return names


class CollectiveCounter(TorchDispatchMode):
    """Counts each (kind, group) with its bytes; `rows()` gives them as trace_record's collectives."""

    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names
        self.counts: Counter = Counter()
        self.bytes: Counter = Counter()
        self.sizes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t == DTensor for t in types):  # DTensor first turns itself into local ops (CommDebugMode's rule)
            return NotImplemented
        kwargs = kwargs or {}
        packet = getattr(func, "_overloadpacket", None)
        if packet in _COLLECTIVES:
            self._count(func, args, kwargs)
        return func(*args, **kwargs)

    def _count(self, func, args, kwargs) -> None:
        named = _arguments(func, args, kwargs)
        name, size = _group(named)
        packet = func._overloadpacket
        kind = packet._qualified_op_name.split("::")[-1].rstrip("_")
        group = self.names.get(name) or _described(name)
        self.sizes[group] = size
        self.counts[kind, group] += 1
        self.bytes[kind, group] += _input_bytes(named)

    def rows(self) -> list[dict]:
        return [{"kind": kind, "group": group, "group_size": self.sizes[group], "count": count,
                 "bytes": self.bytes[kind, group]} for (kind, group), count in sorted(self.counts.items())]


_INPUTS = ("input", "inputs", "input_tensor", "input_tensors", "tensors")  # the schemas' names


def _arguments(func, args, kwargs) -> dict:
    return {**{a.name: v for a, v in zip(func._schema.arguments, args)}, **kwargs}


def _group(named: dict) -> tuple[str, int]:
    """(the group's name, its size): a c10d op takes the ProcessGroup, a functional op its name."""
    if "process_group" in named:  # boxed as a TorchScript object by the dispatcher
        group = dist.ProcessGroup.unbox(named["process_group"])
        return group.group_name, group.size()
    name = named["group_name"]
    return name, dist.distributed_c10d._resolve_process_group(name).size()


def _described(name: str) -> str:
    """A group the runtime's mesh does not name (expert parallelism's "ep" and "efsdp", carved
    from it later) by the dimension the mesh made it for ("mesh_ep"), else by its name."""
    desc = dist.distributed_c10d._resolve_process_group(name).group_desc
    return desc.removeprefix("mesh_") if desc.startswith("mesh_") else name


def _input_bytes(named: dict) -> int:
    """The bytes of the op's input tensor(s): what the rank passes in."""
    source = next(named[key] for key in _INPUTS if key in named)
    return sum(t.numel() * t.element_size() for t in tree_leaves(source) if isinstance(t, torch.Tensor))
