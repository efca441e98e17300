"""The memory terms, one function each; its docstring is its formula (per accelerator, bytes).

Notation: P parameters (P_block one block's, P_root embeddings + final norm + head, P_head the
head's V·h), shards = sharding group x tp, a = compute bytes (2 bf16, 4 fp32), N = tokens a rank
holds per micro-batch (micro_batch x seq / cp), h hidden, L layers, V vocabulary, H heads,
q = H·d_head, kv = H_kv·d_head, I MLP width, t = tp. Each term lists the phases it is alive in
(launcher.plan.memory.PHASES); a function returns None where its term does not apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from launcher.plan.workload import Workload, adapter_parameters
from launcher.wire.training.lora import NF4_TENSOR_BYTES, kind_shape, nf4_bytes, target_kinds

GIB = 2**30
# Backward runs from the last block to the first: activations are freed and gradients made as
# it goes, so the step's total is largest at one of its two ends, and both are phases.
LAST_BLOCK = ("backward_mlp", "backward_attention")
FIRST_BLOCK = ("first_block_mlp", "first_block_attention")
BACKWARD = LAST_BLOCK + FIRST_BLOCK
STEADY = ("forward", "loss") + BACKWARD + ("end_of_backward", "optimizer")
ACTIVE = ("forward", "loss") + LAST_BLOCK  # every block's activations kept


@dataclass(frozen=True)
class MemoryTerm:
    key: str  # stable identifier ("logits", "activations", ...)
    name: str
    gib: float  # per accelerator
    formula: str  # one line: what it is, with the numbers
    phases: tuple[str, ...]
    allocated: bool = True  # False: CUDA context and allocator reserve, not live tensors

    def to_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "gib": round(self.gib, 3), "formula": self.formula,
                "phases": list(self.phases), "allocated": self.allocated}


@dataclass(frozen=True)
class Allocation:
    """One tensor: what a CUDA "Tried to allocate X GiB" message would name."""

    name: str
    gib: float
    formula: str


@dataclass(frozen=True)
class Sizes:
    """Parameter counts of a block (Llama's or GPT-NeoX's: ModelSpec.block_parameters) and of the
    root (embeddings, final norm, head)."""

    block_matmul: int  # q, k, v, o, gate, up, down (MoE: the router and every expert's; GPT-NeoX: up, down)
    block: int  # + the two norms' weights (GPT-NeoX: and their and the projections' biases)
    root: int  # embedding (+ untied head) + final norm
    head: int  # the LM head's weight (shared with the embedding when tied)
    total: int  # every parameter, LoRA's adapters included
    block_gathered: int  # what one block's all-gather brings: under ep only this rank's E/ep experts
    # what trains (has gradients and optimizer state): every parameter, or with LoRA the adapters and
    # the modules trained whole, and of those a block's own
    trained: int = 0
    block_trained: int = 0
    head_trained: bool = True  # the head has a gradient (LoRA: only as a module trained whole)
    nf4: int = 0  # QLoRA: the blocks' linear weights held in NF4 (of total)

    @classmethod
    def of(cls, w: Workload) -> Sizes:
        s = w.spec
        expert = (3 if s.gated_mlp else 2) * s.hidden_size * s.intermediate_size
        experts = s.num_experts or 1  # MoE: every expert's MLP is a parameter
        block, root = s.block_parameters(), s.root_parameters()
        # expert shards are spread over efsdp x ep = the sharding group, so per-rank shards are unchanged
        elsewhere = (experts - experts // w.layout.ep) * expert
        adapters = adapter_parameters(s, w.lora)
        total = s.parameter_count() + s.num_layers * adapters
        if w.lora is None:
            return cls(s.block_matmul_parameters(), block, root, s.vocab_size * s.hidden_size, total,
                       block - elsewhere, trained=total, block_trained=block)
        whole = len(w.lora.modules_to_save) * s.vocab_size * s.hidden_size
        nf4 = s.num_layers * sum(math.prod(kind_shape(s, kind)) for kind in target_kinds(s))
        return cls(s.block_matmul_parameters() + adapters, block + adapters, root, s.vocab_size * s.hidden_size,
                   total, block - elsewhere + adapters, trained=s.num_layers * adapters + whole,
                   block_trained=adapters, head_trained="lm_head" in w.lora.modules_to_save,
                   nf4=nf4 if w.lora.nf4 else 0)


def per_token_bytes(w: Workload) -> dict[str, float]:
    """Bytes one block keeps per local token for backward, by activation checkpointing mode.

    full (no checkpointing):
        2·(4h + a·h)/t   two RMSNorms: the fp32 input (kept by the fp32 normalisation) and the
                         normalised value (kept by the weight multiply); sequence-parallel
      + 2·a·h            the attention's and the MLP's projection inputs (tp-gathered)
      + a·(2q + 2kv)/t   q and k after RoPE, v, the attention output (kept by flash attention)
      + 4·H/t            flash attention's fp32 log-sum-exp
      + 4·a·I/t          SwiGLU: gate and up outputs, silu(gate), their product (GPT-NeoX's GELU
                         MLP: the up output and its GELU, 2·a·I/t)
    selective: the block input a·h/t, the outputs of wq, wk, wv (a·(q + 2kv)/t), of wo and w2
        (a·h each: before tp's reduce-scatter), of w1 and w3 (2·a·I/t), the attention output
        and log-sum-exp (a·q/t + 4·H/t): the matmul and attention outputs the runtime's policy saves.
    selective_op (torchtitan's op policy): the block input, the attention output and log-sum-exp,
        and every other matmul output in forward order: Llama's wq, wv, w1 and w2 outputs
        (a·(q + kv + I)/t + a·h), GPT-NeoX's wqkv and w1 (a·(q + 2kv + I)/t); under tp also the
        two reduce-scatters' outputs (2·a·h/t). MoE: counted as selective (an upper bound).
    checkpoint (full checkpointing): the block input, a·h/t.
    RoPE's cos/sin tables need no gradient: nothing of RoPE is kept.
    MoE (k = experts_per_token, E experts; no tp): the MLP terms count k expert visits per token
    (full: 4·a·I each; selective: 2·a·I and the w2 output a·h each), plus the dispatch buffers
    2·k·a·h (the token rows copied to their experts, the experts' outputs before weighting) and
    the router's fp32 logits and probabilities 8·E (selective: the router matmul output, a·E).
    """
    s, a, t = w.spec, w.compute_bytes, w.layout.tp
    h, heads = s.hidden_size, s.num_heads
    q, kv, inter = heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    mlp = 1 if s.gated_mlp else 0.5  # GELU keeps half of SwiGLU's intermediate tensors
    full = 2 * (4 * h + a * h) / t + 2 * a * h + a * (2 * q + 2 * kv) / t + 4 * heads / t + 4 * mlp * a * inter / t
    selective = a * h / t + a * (q + 2 * kv) / t + 2 * a * h + 2 * mlp * a * inter / t + a * q / t + 4 * heads / t
    if s.is_moe:
        k, experts = s.experts_per_token, s.num_experts
        full += (k - 1) * 4 * a * inter + 2 * k * a * h + 8 * experts
        selective += (k - 1) * (2 * a * inter + a * h) + a * experts
    if s.is_moe:
        op = selective
    elif s.gated_mlp:  # wq, wk, wv, wo, w1, w3, w2: the 1st, 3rd, 5th and 7th kept
        op = a * h / t + a * (q + kv + inter) / t + a * h + a * q / t + 4 * heads / t
    else:  # wqkv, wo, w1, w2: the 1st and 3rd kept
        op = a * h / t + a * (q + 2 * kv + inter) / t + a * q / t + 4 * heads / t
    if t > 1:
        op += 2 * a * h / t
    return {"full": full, "selective": selective, "selective_op": op, "checkpoint": a * h / t}


@dataclass(frozen=True)
class Ctx:
    """What every term needs, computed once."""

    w: Workload

    @cached_property
    def sz(self) -> Sizes:
        return Sizes.of(self.w)

    @cached_property
    def per(self) -> dict[str, float]:
        return per_token_bytes(self.w)

    @property
    def a(self) -> int:
        return self.w.compute_bytes

    @property
    def t(self) -> int:
        return self.w.layout.tp

    @property
    def n(self) -> int:
        return self.w.tokens_per_rank

    @property
    def shards(self) -> int:
        """Over how many ranks a parameter's state is spread: a pipeline stage holds 1/pp of the
        layers (the first and last stage also the embedding and head: counted evenly here)."""
        return self.w.layout.sharding_group * self.w.layout.tp * self.w.layout.pp

    @property
    def kept(self) -> float:
        """Bytes per token per layer kept between forward and backward."""
        return {None: self.per["full"], "selective": self.per["selective"], "selective_op": self.per["selective_op"],
                "full": self.per["checkpoint"]}[self.w.ac_mode]

    def gathered_bytes(self, params: float) -> float:
        """The bytes of `params` parameters of one all-gathered block: a B each, but QLoRA's NF4 weights,
        which FSDP2 gathers and keeps in NF4 (the per-tensor bytes included)."""
        nf4 = self.sz.nf4 / self.w.spec.num_layers  # one block's
        if not nf4:
            return self.a * params
        return self.a * (params - nf4) + nf4_bytes(nf4) + NF4_TENSOR_BYTES * len(target_kinds(self.w.spec))

    @property
    def params(self) -> str:
        return f"{count(self.sz.total)} params"

    @property
    def trained(self) -> str:
        return self.params if self.w.lora is None else f"{count(self.sz.trained)} trained params (LoRA)"


def _term(key: str, name: str, nbytes: float, formula: str, phases: tuple[str, ...]) -> MemoryTerm | None:
    return MemoryTerm(key, name, nbytes / GIB, formula, phases) if nbytes > 0 else None


# --- state ------------------------------------------------------------------------------------

def parameters(c: Ctx) -> MemoryTerm | None:
    """4·P / shards: FSDP2's fp32 parameter shards (the model is built in fp32); with QLoRA all but
    the NF4 base's (nf4_base)."""
    g, pp = c.w.layout.sharding_group, c.w.layout.pp
    fp32 = c.sz.total - c.sz.nf4
    return _term("parameters", "parameters (fp32 shards)", 4 * fp32 / c.shards,
                 f"4 B x {count(fp32) + ' params' if c.sz.nf4 else c.params} / (sharding group {g} x tp {c.t}"
                 f"{f' x pp {pp}' if pp > 1 else ''})", ("init",) + STEADY)


def nf4_base(c: Ctx) -> MemoryTerm | None:
    """QLoRA: the blocks' linear weights in NF4, nf4_bytes of their shard (4.13 bits a weight: codes,
    int8 scales, the scales' fp32 factors) and NF4_TENSOR_BYTES for each tensor whole on every rank.
    Not in a checkpoint (container.models.qlora)."""
    if not c.sz.nf4:
        return None
    tensors = c.w.spec.num_layers * len(target_kinds(c.w.spec)) / c.w.layout.pp
    return _term("nf4_base", "NF4 base (QLoRA)", nf4_bytes(c.sz.nf4 / c.shards) + NF4_TENSOR_BYTES * tensors,
                 f"0.516 B x {count(c.sz.nf4)} NF4 weights / {c.shards} + 68 B x {tensors:.0f} tensors",
                 ("init",) + STEADY)


def optimizer_state(c: Ctx) -> MemoryTerm | None:
    """8·P / shards for AdamW (fp32 exp_avg and exp_avg_sq), 6·P / shards for
    AnyPrecisionAdamW (bf16 moments and Kahan buffer). Created at the first step, then kept. P
    here and in every gradient term is what trains: with LoRA the adapters (and the modules
    trained whole), the frozen base having neither gradients nor optimizer state."""
    state = 8 if c.w.optimizer == "adamw" else 6
    what = "AdamW: fp32 exp_avg + exp_avg_sq" if state == 8 else "AnyPrecisionAdamW: bf16 moments + Kahan buffer"
    return _term("optimizer", "optimizer state", state * c.sz.trained / c.shards,
                 f"{state} B x {c.trained} / {c.shards} ({what})", STEADY)


def gradients(c: Ctx) -> MemoryTerm | None:
    """4·P / shards: fp32 gradient shards (reduce_dtype fp32), from the end of backward to the
    optimizer step (zero_grad(set_to_none=True) frees them before the next forward)."""
    return _term("gradients", "gradients (fp32 shards)", 4 * c.sz.trained / c.shards,
                 f"4 B x {c.trained} / {c.shards}, from backward to the optimizer step",
                 ("end_of_backward", "optimizer"))


def optimizer_temporaries(c: Ctx) -> MemoryTerm | None:
    """AdamW (foreach): 4·P / shards, sqrt(exp_avg_sq) for every tensor at once.
    AnyPrecisionAdamW (a loop over tensors): 6 B x the largest shard, P_head / shards."""
    if c.w.optimizer == "adamw":
        return _term("optimizer_temp", "optimizer temporaries", 4 * c.sz.trained / c.shards,
                     f"4 B x {c.trained} / {c.shards}: foreach AdamW's sqrt(exp_avg_sq) for every tensor at once",
                     ("optimizer",))
    return _term("optimizer_temp", "optimizer temporaries", 6 * c.sz.head / c.shards,
                 "6 B x the largest parameter shard: per-tensor copy and bf16 denominator", ("optimizer",))


def rope_tables(c: Ctx) -> MemoryTerm | None:
    """2 x 4 B x S x d_head: the model's cos and sin buffers, fp32, built for max_context_width."""
    return _term("rope", "RoPE tables", 2 * 4 * c.w.seq_len * c.w.spec.head_dim,
                 f"cos and sin, fp32 [{c.w.seq_len}, {c.w.spec.head_dim}]", ("init",) + STEADY)


def eager_init(c: Ctx) -> MemoryTerm | None:
    """4·P without delayed init: build_model puts the whole fp32 model on every GPU before
    fully_shard cuts it (delayed_param=1 builds it on the meta device instead)."""
    if c.w.delayed_init:
        return None
    return _term("init_model", "whole fp32 model (eager init)", 4 * c.sz.total,
                 f"4 B x {c.params}: built on every GPU before sharding; delayed_param=1 avoids it", ("init",))


# --- FSDP's unsharded copies ------------------------------------------------------------------

def root_unsharded(c: Ctx) -> MemoryTerm | None:
    """a·P_root / t: the root unit is fully_shard'ed with reshard_after_forward=False, so its
    all-gathered copy lives from the start of forward through the blocks' backward. FSDP2
    reshards a unit in its post-backward before it reduce-scatters the unit's gradients, so the
    copy is gone when the root's fp32 reduce-scatter input exists (end_of_backward)."""
    if not c.w.fsdp:
        return None
    return _term("root_unsharded", "embeddings + head, all-gathered", c.a * c.sz.root / c.t,
                 f"{c.a} B x {count(c.sz.root)} / tp {c.t}: the root is not resharded after forward",
                 ACTIVE + FIRST_BLOCK)


def gathered_forward(c: Ctx) -> MemoryTerm | None:
    """2 x a·P_block / t: the running block and the prefetched one (under expert parallelism
    with E/ep of its experts). With torchao's FP8 all-gather the matmul weights travel and stay in 1 B."""
    w = c.w
    if not w.fsdp:
        return None
    fp8_gather = w.fp8 and w.fp8_backend == "torchao" and w.world > 1 and w.layout.sharding_group > 1
    matmul = c.sz.block_matmul - (c.sz.block - c.sz.block_gathered)
    per_block = (matmul * (1 if fp8_gather else c.a) + (c.sz.block - c.sz.block_matmul) * c.a) / c.t
    size = "1 B (FP8 all-gather)" if fp8_gather else f"{c.a} B"
    if c.sz.nf4:  # QLoRA (no FP8, no ep): the base's weights gathered in NF4
        per_block, size = c.gathered_bytes(c.sz.block_gathered) / c.t, f"{c.a} B (NF4 weights 0.516 B)"
    return _term("gathered_forward", "all-gathered blocks (forward)", 2 * per_block,
                 f"2 blocks x {count(c.sz.block_gathered)} params x {size} / tp {c.t}: the running block and the "
                 "prefetched one", ("forward",))


def gathered_backward(c: Ctx) -> MemoryTerm | None:
    """(2·a·P_block + (a + 4)·G_block) / t + 4·G_block / shards: the running and the prefetched
    block's parameters (2·a), the running block's unsharded gradient (a), its fp32 reduce-scatter
    input (4) and the fp32 gradient shard that comes out; G_block = P_block, or with LoRA the
    block's adapters. At the first block nothing is left to
    prefetch (the root is gathered already): one block's a·P_block over, kept for simplicity."""
    if not c.w.fsdp:
        return None
    a, block, grad = c.a, c.sz.block_gathered, c.sz.block_trained
    if c.w.layout.pp > 1:  # the blocks stay gathered, their gradients accumulate (pipeline_accumulation)
        return _term("gathered_backward", "running block's gradient (backward)", a * block / c.t,
                     f"{a} B x {count(block)} / tp {c.t}: before it is added to the stage's fp32 gradients", BACKWARD)
    return _term("gathered_backward", "all-gathered block + grads (backward)",
                 (2 * c.gathered_bytes(block) + (a + 4) * grad) / c.t + 4 * grad / c.shards,
                 f"({a}+{a} B params{' (NF4 weights 0.516 B)' if c.sz.nf4 else ''}, running and prefetched) x "
                 f"{count(block)} + ({a} B gradient + 4 B fp32 "
                 f"reduce-scatter input) x {count(grad)} / tp {c.t} + its fp32 gradient shard", BACKWARD)


def kept_unsharded(c: Ctx) -> MemoryTerm | None:
    """L·a·P_block / t with sharding_strategy shard_grad_op / _hybrid_shard_zero2: blocks stay
    unsharded from their forward to their backward."""
    w = c.w
    if not w.fsdp or w.reshard_after_forward:
        return None
    L = w.spec.num_layers
    return _term("kept_unsharded", "blocks kept unsharded after forward",
                 L * c.gathered_bytes(c.sz.block_gathered) / c.t,
                 f"{L} blocks x {c.a} B x {count(c.sz.block_gathered)} / tp {c.t} (sharding_strategy shard_grad_op)",
                 ("loss",) + LAST_BLOCK)


def pipeline_accumulation(c: Ctx) -> MemoryTerm | None:
    """(a·L·P_block + 4·(L·P_block + P_root / pp)) / t under pipeline parallelism with FSDP:
    torch's schedule runs each microbatch's backward but the last without FSDP's reshard and
    gradient reduction (PipelineStage.backward_maybe_with_nosync) and reduces once after them, so
    through backward the stage's L = layers / pp blocks stay all-gathered and their gradients,
    with its share of the root's, accumulate unsharded in fp32 (a trace's figures, BENCHMARKS.md)."""
    w = c.w
    if not w.fsdp or w.layout.pp == 1:
        return None
    L = w.spec.num_layers // w.layout.pp
    grads = L * c.sz.block + c.sz.root / w.layout.pp
    return _term("pipeline_accumulation", "stage's blocks gathered + fp32 gradients (pipeline)",
                 (c.a * L * c.sz.block_gathered + 4 * grads) / c.t,
                 f"{L} blocks x {count(c.sz.block_gathered)} x {c.a} B kept gathered + 4 B x {count(grads)} gradients "
                 f"(the stage's blocks and its share of the root) / tp {c.t}, unsharded until the step's reduction",
                 BACKWARD)


def head_gradient(c: Ctx) -> MemoryTerm | None:
    """a·P_head / t: the head's unsharded gradient, computed first in backward and kept until the
    root's reduce-scatter at the very end (with LoRA only where the head is trained whole)."""
    if not c.w.fsdp or not c.sz.head_trained:
        return None
    s = c.w.spec
    return _term("head_grad", "head weight gradient (unsharded)", c.a * c.sz.head / c.t,
                 f"{c.a} B x {s.vocab_size} x {s.hidden_size} / tp {c.t}: kept until the root's reduce-scatter",
                 BACKWARD + ("end_of_backward",))


def root_reduce_scatter(c: Ctx) -> MemoryTerm | None:
    """(a·P_head [untied embedding gradient] + a·h + 4·P_root) / t: the root's remaining
    unsharded gradients and the fp32 flat reduce-scatter input FSDP2 copies them into (with LoRA
    only where a module of the root is trained whole: the frozen root has no gradient)."""
    if not c.w.fsdp or (c.w.lora is not None and not c.w.lora.modules_to_save):
        return None
    s = c.w.spec
    embed = 0 if s.tie_embeddings else c.a * c.sz.head
    text = "" if s.tie_embeddings else f"{c.a} B embedding gradient + "
    return _term("root_reduce", "root gradients reduce-scatter",
                 (embed + c.a * s.hidden_size + 4 * c.sz.root) / c.t,
                 text + f"4 B fp32 flat reduce-scatter input x {count(c.sz.root)} / tp {c.t}", ("end_of_backward",))


def running_gradients(c: Ctx) -> MemoryTerm | None:
    """4·(P_head + P_block) without FSDP (one fp32 process): .grad accumulates in place; at the
    last block's backward the head's and that block's gradients exist."""
    if c.w.fsdp:
        return None
    head = c.sz.head if c.sz.head_trained else 0
    return _term("gradients_running", "gradients so far (head + last block)", 4 * (head + c.sz.block_trained),
                 "4 B x (head + one block): fp32 .grad, no FSDP", LAST_BLOCK)


def block_gradients(c: Ctx) -> MemoryTerm | None:
    """At the first block's backward every other block's gradient is made: with FSDP their fp32
    shards, 4·(L − 1)·P_block / (sharding group x tp), L the blocks of a pipeline stage;
    without, their fp32 .grad and the head's, 4·((L − 1)·P_block + P_head)."""
    L = c.w.spec.num_layers // c.w.layout.pp
    if c.w.fsdp and c.w.layout.pp > 1:
        return None  # no shard made before the step's end (pipeline_accumulation)
    if c.w.fsdp:
        shards = c.w.layout.sharding_group * c.t
        return _term("block_gradients", "gradients of the blocks done", 4 * (L - 1) * c.sz.block_trained / shards,
                     f"4 B x {L - 1} blocks x {count(c.sz.block_trained)} / {shards}: fp32 shards", FIRST_BLOCK)
    head = c.sz.head if c.sz.head_trained else 0
    return _term("block_gradients", "gradients of the blocks done + head",
                 4 * ((L - 1) * c.sz.block_trained + head),
                 f"4 B x ({L - 1} blocks x {count(c.sz.block_trained)} + head): fp32 .grad, no FSDP", FIRST_BLOCK)


# --- activations ------------------------------------------------------------------------------

def activations(c: Ctx) -> MemoryTerm | None:
    """L·kept·N, kept = per_token_bytes for the checkpointing mode; with activation_checkpointing_freq
    f only L/f layers are checkpointed and the others keep `full`. Offloaded: only
    activation_loading_horizon + 1 block inputs on the GPU (selective's saved matmul outputs
    stay). Without checkpointing and with cp_comm_type all_gather, every layer keeps the whole
    sequence's K and V: + L·a·2kv·(N·cp − N)/t."""
    w, lay, per = c.w, c.w.layout, c.per
    # a pipeline stage: its L/pp layers, for every microbatch whose backward has not run yet
    L, n = w.spec.num_layers // lay.pp, c.n * w.in_flight
    if w.ac_mode is None:
        how = "no activation checkpointing: everything backward needs"
        saved = L * per["full"] * n
        if lay.cp > 1 and w.cp_comm_type == "all_gather":
            kv = w.spec.num_kv_heads * w.spec.head_dim
            saved += L * c.a * 2 * kv * (n * lay.cp - n) / c.t
            how += ", with all-gathered K/V"
    elif w.offload:
        resident = min(L, w.offload_horizon + 1)
        extra = c.kept - per["checkpoint"]  # what a selective policy keeps beside the block input
        saved = resident * per["checkpoint"] * n + L * extra * n
        how = f"{w.ac_mode} checkpointing, block inputs offloaded ({resident} on the GPU)"
    else:
        wrapped = w.checkpointed_layers
        saved = (wrapped * c.kept + (L - wrapped) * per["full"]) * n
        how = f"{w.ac_mode} checkpointing keeps {c.kept:.0f} B/token/layer"
        if wrapped < L:
            how += f" in {wrapped} of the {L} layers (one in {w.ac_freq}), the others all {per['full']:.0f} B"
    tokens = (f"{w.in_flight} microbatches in flight x {c.n} tokens" if lay.pp > 1
              else f"{n} tokens (B {w.micro_batch} x S {w.seq_len} / cp {lay.cp})")
    return _term("activations", "activations", saved, f"{L} layers x {tokens}: {how}", ACTIVE)


def lora_dropout_activations(c: Ctx) -> MemoryTerm | None:
    """L_kept·N·Σ (a + 1)·in / t over a block's adapted layers, with LoRA's dropout on: each adapter
    keeps its dropped input (a B, what lora_A needs for its gradient) and the dropout's mask (1 B)
    per input feature, in the layers checkpointing does not wrap (a wrapped block keeps its input)."""
    w = c.w
    if w.lora is None or not w.lora.dropout or w.offload:
        return None
    layers = w.spec.num_layers // w.layout.pp - w.checkpointed_layers
    per_token = sum((c.a + 1) * kind_shape(w.spec, kind)[0] for kind in w.lora.targets) / c.t
    return _term("lora_dropout", "LoRA's dropped inputs and masks", layers * per_token * c.n * w.in_flight,
                 f"{layers} layers x {c.n} tokens x {per_token:.0f} B: ({c.a} + 1) B per input feature of "
                 f"{len(w.lora.targets)} adapted layers", ACTIVE)


def first_block_activations(c: Ctx) -> MemoryTerm | None:
    """The activations term's share still kept at the first block's backward: that block's,
    one layer of L (a pipeline stage: one layer of the microbatch in backward, and all of the
    other in_flight − 1 microbatches')."""
    whole = activations(c)
    if whole is None:
        return None
    layers, in_flight = c.w.spec.num_layers // c.w.layout.pp, c.w.in_flight
    share = (in_flight - 1 + 1 / layers) / in_flight
    what = f"1 of {layers} layers" + (f", + {in_flight - 1} other microbatches in flight" if in_flight > 1 else "")
    return MemoryTerm("first_block_activations", "activations the first block kept", whole.gib * share,
                      f"{what} of the activations", FIRST_BLOCK)


def final_norm_and_head_input(c: Ctx) -> MemoryTerm | None:
    """((4 + a)·h/t + a·h)·N: the final RMSNorm's kept values and the head's (tp-gathered)
    input; under cp also the cos/sin rows gathered for this rank's positions (8·d_head·N)."""
    h, a, n = c.w.spec.hidden_size, c.a, c.n
    rope = 8 * c.w.spec.head_dim * n if c.w.layout.cp > 1 else 0
    return _term("final", "final norm + head input", ((4 * h + a * h) / c.t + a * h) * n + rope,
                 f"((4+{a}) B x {h} / tp + {a} B x {h}) x {n} tokens", ("loss",))


def block_forward(c: Ctx) -> MemoryTerm | None:
    """3·a·I/t·N with checkpointing: inside a block's forward, gate, up and their product live
    together although nothing is kept (without checkpointing they are in `activations`); GPT-NeoX's
    GELU MLP: the up output and its GELU, 2·a·I/t·N."""
    if c.w.ac_mode is None:
        return None
    inter, n = c.w.spec.intermediate_size, (3 if c.w.spec.gated_mlp else 2)
    what = "gate, up and their product" if c.w.spec.gated_mlp else "up and its GELU"
    return _term("block_forward", "block forward temporaries", n * c.a * inter / c.t * c.n,
                 f"{n} x {c.a} B x {inter} / tp {c.t} x {c.n} tokens: {what}", ("forward",))


def logits(c: Ctx) -> MemoryTerm | None:
    """b·C·V/t + a·N·h: the loss is cross_entropy(logits.float()) over chunks of C =
    loss_chunk_tokens tokens, each under an activation checkpoint (container/loss.py). Backward
    recomputes one chunk's logits at a time and holds its fp32 log-probabilities kept by
    log_softmax, their gradient from nll_loss and the logits' fp32 gradient: b = 12 (4 B each);
    forward peaks lower, at 10 B (bf16 logits, their fp32 copy, the log-probabilities). Under
    tensor parallelism torch's loss_parallel kernels hold five fp32 tensors of the local
    [C, V/t] at their peak in backward: b = 20 (traced, bench/memory_trace.py). The hidden
    states' gradient (a B, tp-gathered) fills up chunk by chunk until the last one.
    Not chunked (loss_chunk_tokens 0, or N <= C): b·N·V/t, the whole micro-batch's logits;
    then one fp32 [N, V/t] tensor is the step's largest allocation."""
    w, V, n = c.w, c.w.spec.vocab_size, c.n
    rows = w.logits_tokens
    if c.t > 1:
        b, held = 20, "loss_parallel's backward holds five fp32 tensors of the local logits"
    else:
        b, held = 12, ("fp32 log-probs kept, their gradient, the logits' gradient (forward: bf16 logits + fp32 "
                       "copy + log-probs = 10 B)")
    if rows == n:
        return _term("logits", "logits + loss (fp32)", b * n * V / c.t,
                     f"{b} B x {n} tokens x {V} / tp {c.t}: {held}", ("loss",))
    h = w.spec.hidden_size
    return _term("logits", "logits + loss (fp32)", b * rows * V / c.t + c.a * n * h,
                 f"{b} B x {rows} tokens (one loss chunk of {n}) x {V} / tp {c.t}: {held}; + {c.a} B x {n} x {h} "
                 "hidden-state gradient", ("loss",))


def block_backward(c: Ctx) -> MemoryTerm | None:
    """(full − kept + 2·a·h/t)·N: the last block's recomputed activations (all of them under
    full checkpointing, what selective did not keep) and the gradients of its output and of
    the residual stream."""
    h = c.w.spec.hidden_size
    last_wrapped = c.w.ac_mode is not None and (c.w.spec.num_layers // c.w.layout.pp) % c.w.ac_freq == 0
    recompute = c.per["full"] - c.kept if last_wrapped else 0.0
    return _term("block_backward", "block backward (recompute + grads)", (recompute + 2 * c.a * h / c.t) * c.n,
                 f"({recompute:.0f} B recomputed + 2 x {c.a} B x {h} / tp gradients) x {c.n} tokens", BACKWARD)


def mlp_backward(c: Ctx) -> MemoryTerm | None:
    """3·a·I/t·N: the MLP's backward, gradients of the product, of silu(gate) and of up
    (GPT-NeoX: of the GELU and of up, 2·a·I/t·N)."""
    inter, n = c.w.spec.intermediate_size, (3 if c.w.spec.gated_mlp else 2)
    return _term("mlp_grads", "MLP backward temporaries", n * c.a * inter / c.t * c.n,
                 f"{n} x {c.a} B x {inter} / tp {c.t} x {c.n} tokens", ("backward_mlp", "first_block_mlp"))


def attention(c: Ctx) -> MemoryTerm | None:
    """(4q + 3·a·q + 4H)/t·N: flash attention's backward (fp32 dq accumulator, dq, dK and dV
    expanded to H heads, fp32 row sums), plus under cp Transformer Engine's exchange buffers:
    p2p 4·2·a·kv/t·N (K/V chunks in flight and their gradients), all_gather 2·2·a·kv·N·cp/t
    (the whole sequence's K/V and their gradients), a2a 2·a·(2q + 2kv)/t·N (send and receive)."""
    w, a, t, n = c.w, c.a, c.t, c.n
    s = w.spec
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    nbytes = (4 * q + 3 * a * q + 4 * s.num_heads) / t * n
    formula = f"(4 B fp32 dq + {a} B dq + 2 x {a} B GQA-expanded dK/dV) x {q} / tp x {n} tokens"
    cp = w.layout.cp
    if cp > 1 and w.cp_comm_type == "all_gather":
        nbytes += 2 * 2 * a * kv * n * cp / t
        formula += f" + whole-sequence K/V and their gradients ({n * cp} tokens)"
    elif cp > 1 and w.cp_comm_type == "a2a":
        nbytes += 2 * a * (2 * q + 2 * kv) / t * n
        formula += " + all-to-all send/receive buffers of q, k, v, out"
    elif cp > 1:
        nbytes += 4 * 2 * a * kv / t * n
        formula += " + ring buffers: K/V chunks in flight and their gradients"
    return _term("attention", "attention working memory", nbytes, formula,
                 ("backward_attention", "first_block_attention"))


def nf4_dequantize(c: Ctx) -> MemoryTerm | None:
    """20 B x the largest NF4 weight: torchao dequantizes a weight for each of its matmuls, forward and
    backward (LinearNF4), holding at once its codes as int64 (8 B a weight), their levels and the
    scaled levels in fp32 (4 + 4 B) and their interleaved stack (4 B), before the cast to the
    compute dtype."""
    if not c.sz.nf4:
        return None
    s = c.w.spec
    kind = max(target_kinds(s), key=lambda k: math.prod(kind_shape(s, k)))
    largest = math.prod(kind_shape(s, kind))
    return _term("nf4_dequantize", "NF4 dequantization temporaries", 20 * largest,
                 f"20 B x {count(largest)} ({kind}: int64 codes, fp32 levels, scaled levels and their stack)",
                 ("forward",) + BACKWARD)


def fp8_weights(c: Ctx) -> MemoryTerm | None:
    """blocks·b·P_block_matmul/t with FP8: Transformer Engine keeps each weight's FP8 cast and
    its transpose for backward (b = 2), torchao its FP8 cast (b = 1); for the running block
    under checkpointing, for all L blocks without. (TE's amax histories, 3 x 1024 fp32 per
    projection, are a few MiB and left out.)"""
    w = c.w
    if not w.fp8:
        return None
    te = w.fp8_backend == "transformer_engine"
    blocks, nbytes = (1 if w.ac_mode else w.spec.num_layers), (2 if te else 1)
    what = "(TE keeps the FP8 weight and its transpose)" if te else "(torchao's FP8 weight cast)"
    return _term("fp8_weights", "FP8 weight casts", blocks * nbytes * c.sz.block_matmul / c.t,
                 f"{blocks} block(s) x {nbytes} B x {count(c.sz.block_matmul)} {what}",
                 ACTIVE if not w.ac_mode else ("forward",) + BACKWARD)


TERMS = (parameters, nf4_base, optimizer_state, gradients, optimizer_temporaries, rope_tables, eager_init,
         root_unsharded, gathered_forward, gathered_backward, kept_unsharded, pipeline_accumulation, head_gradient,
         root_reduce_scatter, running_gradients, block_gradients, activations, lora_dropout_activations,
         first_block_activations,
         final_norm_and_head_input, block_forward, logits, block_backward, mlp_backward, attention, fp8_weights,
         nf4_dequantize)


def terms(w: Workload) -> list[MemoryTerm]:
    c = Ctx(w)
    return [term for fn in TERMS if (term := fn(c)) is not None]


def largest_allocation(w: Workload) -> Allocation:
    """The largest single tensor of the step; the candidates are the big flat ones: the fp32
    logits of a loss chunk (4·C·V/t; 4·N·V/t not chunked), an MLP activation (a·N·I/t), FSDP's
    fp32 reduce-scatter inputs of the root (4·P_root/t) and of a block (4·P_block/t), the fp32
    embedding under eager init (4·V·h) and, with cp_comm_type all_gather, the gathered K/V
    (2·a·kv·N·cp/t)."""
    s, lay, sz = w.spec, w.layout, Sizes.of(w)
    a, t, n, rows = w.compute_bytes, lay.tp, w.tokens_per_rank, w.logits_tokens
    tokens = f"{w.micro_batch} x {w.seq_len // lay.cp} tokens" if rows == n else (
        f"{rows} tokens (one loss chunk of {n})")
    candidates = [
        Allocation("fp32 logits", 4 * rows * s.vocab_size / t / GIB,
                   f"logits.float() in the loss: {tokens} x {s.vocab_size // t} vocab x 4 B"),
        Allocation("MLP activation", a * n * s.intermediate_size / t / GIB,
                   f"gate or up output: {n} tokens x {s.intermediate_size // t} x {a} B"),
    ]
    if w.fsdp:
        candidates += [
            Allocation("root reduce-scatter buffer", 4 * sz.root / t / GIB,
                       f"FSDP's fp32 input for the root's gradients: {count(sz.root)} params x 4 B / tp {t}"),
            Allocation("block reduce-scatter buffer", 4 * sz.block / t / GIB,
                       f"FSDP's fp32 input for a block's gradients: {count(sz.block)} params x 4 B / tp {t}"),
        ]
    if not w.delayed_init:
        candidates.append(Allocation("fp32 embedding (eager init)", 4 * sz.head / GIB,
                                     f"{s.vocab_size} x {s.hidden_size} x 4 B"))
    if lay.cp > 1 and w.cp_comm_type == "all_gather":
        kv = s.num_kv_heads * s.head_dim
        candidates.append(Allocation("all-gathered K/V", 2 * a * kv * n * lay.cp / t / GIB,
                                     f"2 x {n * lay.cp} tokens x {kv} x {a} B"))
    return max(candidates, key=lambda cand: cand.gib)


def count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))
