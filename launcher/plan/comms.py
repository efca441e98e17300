"""The communication of one training pass under smlaunch's runtime, and how much compute hides.

A pass is one micro-batch's forward and backward on one rank (a pipeline microbatch under
pipeline parallelism); the trainer syncs gradients on every one (container/trainer.py). The
model follows what the runtime does (docs/planner.md has the formulas and their sources):

- FSDP2 (container/distributed/parallelize.py): every block is a unit; its bf16 parameters are all-gathered
  before its forward and, with reshard_after_forward, again before its backward; its gradients
  are reduce-scattered in fp32 (MixedPrecisionPolicy reduce_dtype=float32) over the sharding
  group dp_shard x cp, then all-reduced over dp_replicate (HSDP). The root unit (embeddings,
  final norm, head) is gathered once and reduced once. FSDP2 prefetches the next block's
  all-gather while this block computes, and reduces the previous block's gradients while this
  one's backward runs: only the part that exceeds a block's compute waits, plus the first
  all-gather and the last reduction of the pass, and the root's, which nothing overlaps.
- Context parallelism (container/distributed/context_parallel.py, Transformer Engine on GPUs): with
  cp_comm_type p2p, K and V travel round the cp ring, cp - 1 hops per block forward, twice as much
  backward (K/V again and their gradients back), once more when full checkpointing recomputes the
  forward; each hop overlaps the attention on the chunk at hand, so only the part exceeding the
  block's attention compute waits. all_gather and a2a (Ulysses) are counted as exposed.
- Tensor parallelism with sequence parallelism (container/distributed/tensor_parallel.py): per block forward
  two all-gathers (attention and MLP inputs) and two reduce-scatters (wo and w2 outputs) of the
  block's activations, the same four in backward, four more under full checkpointing; nothing
  overlaps them (no async TP).

A collective over n ranks moves bytes x (n - 1) / n per rank (ring all-gather or reduce-scatter;
an all-reduce twice that) at the bandwidth of the slowest link its ring crosses: the GPUs' link
(NVLink, or PCIe without it) when the group fits in one host; across hosts, the group's share
of the host's network, network x (the group's ranks on a host) / (GPUs on a host): the network
is wired per GPU (p4d: a 100 Gbit/s EFA per 2 GPUs, p5: 4 x 100 per GPU), and every group of
that dimension on the host crosses it at once. Mesh order is (pp, dp_replicate,
dp_shard, cp, tp), tp innermost, and ranks fill hosts in order (launcher/wire/training/layout.py).
Nominal bandwidths are used: the calibrated efficiency of compute absorbs what NCCL loses.
Pipeline send/receive of activations, expert all-to-all and the optimizer step are not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.plan.terms import Sizes
from launcher.plan.workload import Workload

PARAM_BYTES = 2  # FSDP2's param_dtype bf16: what an all-gather moves per parameter
GRAD_BYTES = 4  # reduce_dtype float32: what a reduce-scatter / all-reduce moves per gradient
ACTIVATION_BYTES = 2  # bf16 activations, K and V


@dataclass(frozen=True)
class Link:
    gb_s: float  # GB/s per direction per rank
    name: str


@dataclass(frozen=True)
class LayerCompute:
    """Seconds one rank computes for one block in one pass (recomputation included in backward)."""

    forward_s: float
    backward_s: float
    attention_forward_s: float
    attention_backward_s: float


@dataclass(frozen=True)
class Communication:
    """One parallelism's collectives: time on the wire, and the part compute does not hide."""

    name: str  # "fsdp", "cp", "tp"
    total_s: float
    exposed_s: float
    link: str

    def times(self, passes: int) -> Communication:
        return Communication(self.name, self.total_s * passes, self.exposed_s * passes, self.link)

    def to_dict(self) -> dict:
        return {"total_s": round(self.total_s, 4), "exposed_s": round(self.exposed_s, 4), "link": self.link}


class UnknownLink(ValueError):
    """A group crosses a link the catalog has no bandwidth for."""


def group_link(w: Workload, size: int, stride: int) -> Link:
    """The slowest link a ring over `size` ranks `stride` apart in rank order crosses."""
    acc, pph = w.instance.accelerator, w.processes_per_host
    if acc.link_gb_s is None:
        raise UnknownLink(f"{acc.model}: no GPU-to-GPU bandwidth in the catalog")
    if size * stride <= pph:
        return Link(acc.link_gb_s, acc.link)
    gbps = w.instance.network_gbps
    if gbps is None:
        raise UnknownLink(f"{w.instance.name}: no network bandwidth in the catalog")
    per_host = max(1, min(size, pph // stride))
    gpus = w.instance.accelerators or pph  # the network is wired per GPU, whatever runs on the rest
    return Link(min(acc.link_gb_s, gbps / 8 * per_host / gpus),
                f"network {gbps:g} Gbit/s x {per_host}/{gpus} GPUs per host")


def spread_s(nbytes: float, n: int, link: Link) -> float:
    """Seconds for a ring all-gather / reduce-scatter of `nbytes` (the whole tensor) over n ranks."""
    return nbytes * (n - 1) / n / (link.gb_s * 1e9)


def pass_communication(w: Workload, layer: LayerCompute) -> list[Communication]:
    """The collectives of one pass, each with its exposed part; raises UnknownLink."""
    found = (fsdp(w, layer), context_parallel(w, layer), tensor_parallel(w))
    return [c for c in found if c is not None]


def _layers(w: Workload) -> int:
    return math.ceil(w.spec.num_layers / w.layout.pp)


def fsdp(w: Workload, layer: LayerCompute) -> Communication | None:
    lay = w.layout
    shard, replicas = lay.sharding_group, lay.dp_replicate
    if not w.fsdp or shard * replicas == 1:
        return None
    sizes = Sizes.of(w)
    shard_link = group_link(w, shard, lay.tp)
    replica_link = group_link(w, replicas, lay.tp * shard) if replicas > 1 else shard_link

    def gather(params: float) -> float:
        return spread_s(params * PARAM_BYTES, shard, shard_link) if shard > 1 else 0.0

    def reduce(params: float) -> float:
        scatter = spread_s(params * GRAD_BYTES, shard, shard_link) if shard > 1 else 0.0
        if replicas == 1:
            return scatter
        return scatter + 2 * spread_s(params / shard * GRAD_BYTES, replicas, replica_link)  # all-reduce

    block, root = sizes.block / lay.tp, sizes.root / lay.tp  # TP slices are what FSDP shards
    n = _layers(w)
    ag, red = gather(block), reduce(block)
    again = ag if w.reshard_after_forward else 0.0
    root_s = gather(root) + reduce(root)
    total = n * (ag + again + red) + root_s
    exposed = (ag + (n - 1) * max(0.0, ag - layer.forward_s)
               + again + red + (n - 1) * max(0.0, again + red - layer.backward_s) + root_s)
    names = {shard_link.name} | ({replica_link.name} if replicas > 1 else set())
    return Communication("fsdp", total, exposed, "; ".join(sorted(names)))


def context_parallel(w: Workload, layer: LayerCompute) -> Communication | None:
    lay, spec = w.layout, w.spec
    cp = lay.cp
    if cp == 1:
        return None
    link = group_link(w, cp, lay.tp)
    n = _layers(w)
    recompute = 1 if w.ac_mode == "full" else 0
    if w.cp_comm_type == "a2a":  # Q, K, V in and the output back, head-sharded
        heads = 2 * spec.num_heads + 2 * spec.num_kv_heads
        # each rank keeps 1/cp of its tokens' tensors and sends the rest: (cp - 1)/cp, a spread
        forward = spread_s(w.tokens_per_rank * heads * spec.head_dim / lay.tp * ACTIVATION_BYTES, cp, link)
        total = n * forward * (2 + recompute)
        return Communication("cp", total, total, link.name)
    kv = w.tokens_per_rank * 2 * spec.num_kv_heads * spec.head_dim / lay.tp * ACTIVATION_BYTES
    forward = spread_s(kv * cp, cp, link)  # every rank's K/V visits the cp - 1 others
    backward = forward * (2 + recompute)
    total = n * (forward + backward)
    if w.cp_comm_type != "p2p":  # all_gather: gathered before the attention runs
        return Communication("cp", total, total, link.name)
    exposed = n * (max(0.0, forward - layer.attention_forward_s) + max(0.0, backward - layer.attention_backward_s))
    return Communication("cp", total, exposed, link.name)


def tensor_parallel(w: Workload) -> Communication | None:
    tp = w.layout.tp
    if tp == 1:
        return None
    link = group_link(w, tp, 1)
    activations = w.tokens_per_rank * w.spec.hidden_size * ACTIVATION_BYTES
    per_block = 8 + (4 if w.ac_mode == "full" else 0)
    total = _layers(w) * per_block * spread_s(activations, tp, link)
    return Communication("tp", total, total, link.name)
