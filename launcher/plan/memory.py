"""Memory per accelerator of a Llama-family job, as THIS runtime runs it (container/trainer.py).

What the runtime keeps, and so what is counted (B = bytes; a = compute bytes: 2 in bf16, 4 in fp32):

- FSDP2 keeps fp32 parameter shards and fp32 gradient shards (model built in fp32,
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)); AdamW's two moments are fp32,
  AnyPrecisionAdamW keeps bf16 moments and a bf16 Kahan buffer. All over sharding group x tp.
- Blocks are all-gathered in bf16 one at a time with one prefetched; the root (embeddings, final
  norm, head) is fully_shard'ed with reshard_after_forward=False, so its bf16 copy lives from the
  start of forward to the end of backward.
- The loss is `F.cross_entropy(logits.float(), ...)` over chunks of `loss_chunk_tokens` tokens
  (container/loss.py), each checkpointed: one chunk's fp32 [C, V/tp] logits and their gradients
  exist at a time, and the hidden states' gradient. With `loss_chunk_tokens: 0`, or a micro-batch
  of no more tokens, it runs on the whole [B, S/cp, V/tp] logits, whose fp32 copy is then the
  largest tensor of a long-context step (the seed's "Tried to allocate 7.83 GiB").
- Activation checkpointing wraps each block, or every activation_checkpointing_freq-th (torch
  checkpoint, non-reentrant): `full` keeps the block input, `selective` also keeps matmul and
  attention outputs, `selective_op` the attention output and every other matmul's; offload moves
  the kept block inputs to host memory, `activation_loading_horizon` of them prefetched back.
- Context parallelism cuts every sequence over cp ranks; tensor parallelism splits heads, MLP and
  vocabulary over tp with sequence-parallel norms (the projections' inputs are tp-gathered).

Each term is one function of launcher/plan/terms.py whose docstring is its formula.
The step's memory is not one sum: different tensors are alive at different moments. Every term
names the phases it is alive in; the peak is the largest phase total (PHASES says what each
phase is). Peak memory = that total x (1 + ALLOCATOR_RESERVE) + CUDA context (+ NCCL); it fits
when it is within the accelerator's memory less SAFETY_MARGIN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.plan.terms import GIB, Allocation, MemoryTerm, largest_allocation, terms
from launcher.plan.workload import Workload

__all__ = ["GIB", "Allocation", "Fix", "MemoryEstimate", "MemoryTerm", "estimate_workload"]

# Kept free of the accelerator's nominal memory: CUDA shows 1-2% less than the nominal figure,
# and the rest covers this model's error until calibrated (bench/plan_calibration.py).
SAFETY_MARGIN = 0.05
# The caching allocator reserves more than it hands out (fragmentation between differently
# sized blocks), as a fraction of the peak of live tensors.
ALLOCATOR_RESERVE = 0.05
CUDA_CONTEXT_GIB = 0.5  # CUDA context, kernels and cuBLAS workspaces (not in max_memory_allocated)
NCCL_GIB = 0.5  # NCCL communicator buffers when there is more than one rank

PHASES = {
    "init": "model construction (eager init builds the whole fp32 model on every GPU)",
    "forward": "forward of the last block",
    "loss": "loss: logits, log-probabilities and their gradients",
    "backward_mlp": "backward of the last block's MLP",
    "backward_attention": "backward of the last block's attention",
    "first_block_mlp": "backward of the first block's MLP (one block's activations left, every other block's "
                       "gradient made)",
    "first_block_attention": "backward of the first block's attention",
    "end_of_backward": "end of backward: the root's gradients reduce-scattered",
    "optimizer": "optimizer step",
}


@dataclass(frozen=True)
class Fix:
    """A change that lowers the peak, checked by validating and re-planning the changed job."""

    overrides: tuple[str, ...]  # --set KEY=VALUE strings
    peak_gib: float
    fits: bool | None
    usd_per_billion_tokens: float | None = None

    def to_dict(self) -> dict:
        return {"set": list(self.overrides), "peak_gib": round(self.peak_gib, 2), "fits": self.fits,
                "usd_per_billion_tokens": self.usd_per_billion_tokens}


@dataclass
class MemoryEstimate:
    terms: list[MemoryTerm]
    phases: dict[str, float]  # GiB of live tensors per phase
    peak_phase: str
    allocated_gib: float  # peak of live tensors: what torch.cuda.max_memory_allocated reports
    peak_gib: float  # allocated + allocator reserve + CUDA context/NCCL: what must fit
    capacity_gib: float | None  # the accelerator's memory (catalog); None when unknown (local, CPU)
    largest_allocation: Allocation
    instance_type: str | None = None
    accelerator: str | None = None
    advice: list[Fix] = field(default_factory=list)  # filled by advice.estimate_memory when it predicts OOM

    @property
    def usable_gib(self) -> float | None:
        return None if self.capacity_gib is None else self.capacity_gib * (1 - SAFETY_MARGIN)

    @property
    def fits(self) -> bool | None:
        """Peak within capacity less SAFETY_MARGIN; None when the capacity is unknown."""
        return None if self.capacity_gib is None else self.peak_gib <= self.usable_gib

    @property
    def oom(self) -> bool:
        """Predicted out of memory (False when the capacity is unknown)."""
        return self.fits is False

    @property
    def terms_at_peak(self) -> list[MemoryTerm]:
        return [t for t in self.terms if self.peak_phase in t.phases]

    @property
    def dominant(self) -> MemoryTerm:
        """The largest live-tensor term at the peak."""
        return max((t for t in self.terms_at_peak if t.allocated), key=lambda t: t.gib)

    def term(self, key: str) -> MemoryTerm | None:
        return next((t for t in self.terms if t.key == key), None)

    def gib(self, key: str) -> float:
        found = self.term(key)
        return found.gib if found else 0.0

    def to_dict(self) -> dict:
        return {
            "fits": self.fits,
            "peak_gib": round(self.peak_gib, 3),
            "allocated_gib": round(self.allocated_gib, 3),
            "capacity_gib": self.capacity_gib,
            "instance_type": self.instance_type,
            "accelerator": self.accelerator,
            "usable_gib": None if self.usable_gib is None else round(self.usable_gib, 3),
            "safety_margin": SAFETY_MARGIN,
            "peak_phase": self.peak_phase,
            "largest_allocation": {"name": self.largest_allocation.name,
                                   "gib": round(self.largest_allocation.gib, 3),
                                   "formula": self.largest_allocation.formula},
            "dominant": self.dominant.key,
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "terms": [t.to_dict() for t in self.terms],
            "advice": [f.to_dict() for f in self.advice],
        }


def gpu_overhead_gib(world: int) -> float:
    """What a GPU holds beside the allocator's tensors: CUDA's context, and NCCL's buffers with peers."""
    return CUDA_CONTEXT_GIB + (NCCL_GIB if world > 1 else 0.0)


def required_gib(allocated: float, world: int) -> float:
    """The memory a GPU needs for a peak of `allocated` GiB of live tensors (the planner's, or a
    trace's: launcher.plan.fits): the allocator's reserve on top, and the overhead."""
    return allocated * (1 + ALLOCATOR_RESERVE) + gpu_overhead_gib(world)


def estimate_workload(w: Workload) -> MemoryEstimate:
    """The memory estimate of a workload (no advice; see advice.estimate_memory)."""
    found = terms(w)
    phases = {p: sum(t.gib for t in found if p in t.phases and t.allocated) for p in PHASES}
    phases = {p: v for p, v in phases.items() if any(p in t.phases for t in found)}
    peak_phase = max(phases, key=phases.get)
    allocated = phases[peak_phase]
    on_gpu = w.instance is not None and w.instance.accelerator is not None
    overhead = gpu_overhead_gib(w.world)
    if on_gpu:
        found.append(MemoryTerm("reserve", "allocator reserve", ALLOCATOR_RESERVE * allocated,
                                f"{ALLOCATOR_RESERVE:.0%} of the {allocated:.2f} GiB peak of live tensors "
                                "(caching-allocator fragmentation)", tuple(phases), allocated=False))
        found.append(MemoryTerm("context", "CUDA context + NCCL", overhead,
                                f"{CUDA_CONTEXT_GIB} GiB CUDA context and workspaces"
                                + (f" + {NCCL_GIB} GiB NCCL buffers" if w.world > 1 else ""),
                                tuple(phases), allocated=False))
    peak = required_gib(allocated, w.world) if on_gpu else allocated
    return MemoryEstimate(
        terms=found, phases=phases, peak_phase=peak_phase, allocated_gib=allocated, peak_gib=peak,
        capacity_gib=w.instance.accelerator.memory_gib if on_gpu else None,
        largest_allocation=largest_allocation(w),
        instance_type=w.instance.name if w.instance else None,
        accelerator=w.instance.accelerator.model if on_gpu else None)
