"""Training FLOPs per token, the seed's figure beside it, peak TFLOPS and MFU.

Two numbers are reported side by side (docs/seed-runs.md, "The seed's TFLOPS formula"):

- `flops_per_token`: the correct count for a Llama block (SwiGLU MLP, grouped-query attention),
  causal attention halved; this is what TFLOPS/GPU and MFU are computed from.
- `seed_flops_per_token`: what AWS's SMP v2 example script (`compute_tflops` in its
  `train_utils.py`, a copy of Megatron-LM's `num_floating_point_operations`) reports, so a run
  can be compared with the seed's 247 and 372 TFLOPS/GPU.
"""

from __future__ import annotations

from launcher.wire.training.catalog import (
    A10G,
    A100_40,
    B200,
    B300,
    GB200,
    H100,
    H200,
    L4,
    L40S,
    get_instance_type,
)
from launcher.wire.training.models import ModelSpec


def matmul_params(spec: ModelSpec) -> int:
    """Weights that take part in a matmul per token: every block's q/k/v/o and gate/up/down
    projections (GPT-NeoX: q/k/v/o and its two MLP matrices) plus the LM head. The input
    embedding is a lookup (no FLOPs); norm weights and biases are elementwise (a few hundred
    thousand FLOPs per token, left out). An MoE block counts its router and the experts_per_token
    experts a token visits (its active parameters)."""
    h, d = spec.hidden_size, spec.head_dim
    attention = h * spec.num_heads * d * 2 + h * spec.num_kv_heads * d * 2  # q, o; k, v (GQA)
    mlp = (3 if spec.gated_mlp else 2) * h * spec.intermediate_size  # SwiGLU: gate, up, down; GELU: up, down
    if spec.is_moe:
        mlp = spec.experts_per_token * mlp + h * spec.num_experts
    return spec.num_layers * (attention + mlp) + h * spec.vocab_size  # LM head, tied or not


def causal_span(seq_len: float, window: int | None = None) -> float:
    """The keys a token attends to on average, as a causal row of `seq_len` tokens counts them
    (S/2); with a sliding window W < S the first W tokens see their whole prefix and the rest W
    keys each: W - W²/(2S)."""
    if window is None or window >= seq_len:
        return seq_len / 2
    return window - window * window / (2 * seq_len)


def flops_per_token(spec: ModelSpec, seq_len: float, causal: bool = True) -> float:
    """Training FLOPs per token: 6·N + 12·L·H·d_head·S, the attention term halved when causal.
    S is the length each token's attention spans: the row's, or with document masking the
    documents' (`attended_length`); a sliding window shortens it (`causal_span`).

    N = `matmul_params(spec)`: the non-embedding weights including the LM head, as PaLM
    (appendix B) and torchtitan count it; 6 = 2 FLOPs per multiply-add × (forward + two backward
    matmuls). Attention scores QKᵀ and the weighted sum A·V are each 2·H·d_head·S FLOPs per token
    forward, ×3 for training = 12·L·H·d_head·S; a causal mask makes half of them unnecessary
    (flash attention skips them), hence 6·L·H·d_head·S by default. Activation recomputation is
    not counted: it is overhead, not useful work (the MFU convention).
    """
    attention = 12 * spec.num_layers * spec.num_heads * spec.head_dim
    span = causal_span(seq_len, spec.sliding_window) if causal else min(seq_len, spec.sliding_window or seq_len)
    return 6.0 * matmul_params(spec) + attention * span


def attended_length(length_buckets: list[list[int]], seq_len: int) -> float | None:
    """The mean attention length per token of rows of `seq_len` tokens cut from documents with
    these lengths (an indexed shard header's `lengths` buckets: [b, count, sum, sum of squares] of
    the lengths in [2^b, 2^(b+1))), with document masking: a row's causal attention work is
    Σ lᵢ²/2 over its documents' pieces, a causal row's S²/2, so per token it is that of a
    row of Σ lᵢ²/S tokens. A document shorter than S counts L² (a row boundary through it is
    ignored: an overestimate of 2·l₁·l₂ at most), a longer one L·S (its pieces are whole rows);
    a bucket that straddles S takes the smaller of the two. None without documents."""
    work = tokens = 0
    for bucket, _count, total, squares in length_buckets:
        low, high = 2**bucket, 2 ** (bucket + 1)
        if high <= seq_len:
            work += squares
        elif low >= seq_len:
            work += seq_len * total
        else:
            work += min(squares, seq_len * total)
        tokens += total
    return min(float(seq_len), work / tokens) if tokens else None


def seed_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """The seed's per-token FLOPs: Megatron-LM's formula as AWS's SMP v2 script writes it,

        12·L·h²·[(1 + kv/H + S/h)·(H·d_head/h) + I/h · g + V/(2·L·h)]

    with g (the gated-linear multiplier, 3/2 for SwiGLU) set to 1 for dense models: that script
    applies 3/2 only when `moe` is set, and then also multiplies the MLP term by the experts per
    token (Megatron's num_experts_routed_to; the router is not counted). Its two errors against
    `flops_per_token`: the MLP is counted as two h×I matrices instead of three, and attention is
    not halved for the causal mask. GQA and the LM head are counted correctly. For Llama 3.1 8B this reads −9% at 8K,
    +3% at 16K and +21% at 32K relative to the causal count (docs/seed-runs.md; tests/unit/test_flops.py).

    The older Megatron paper formula, 72·L·h²·(1 + S/(6h) + V/(12·h·L)), which also ignores
    GQA and the real MLP width, does not reproduce those percentages (+6%, +17%, +32%).
    """
    h, L = spec.hidden_size, spec.num_layers
    query_ratio = spec.num_heads * spec.head_dim / h
    attention = (1 + spec.num_kv_heads / spec.num_heads + seq_len / h) * query_ratio
    mlp = spec.intermediate_size / h * (1.5 * spec.experts_per_token if spec.is_moe else 1)
    logits = spec.vocab_size / (2 * L * h)
    return 12.0 * L * h * h * (attention + mlp + logits)


def mfu(tflops_per_device: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation as a fraction (0.45 = 45%) of the device's dense peak."""
    return tflops_per_device / peak_tflops


# CUDA device names (torch.cuda.get_device_name) → dense (bf16, fp8) TFLOPS, for runs outside
# SageMaker (local_gpu, a workstation). Most specific names first: "H100" is also in
# "H100 PCIe", "L4" in "L40S". PCIe and NVL H100s run at lower clocks than SXM (NVIDIA
# datasheet figures with sparsity halved); the rest come from the catalog.
_DEVICE_PEAKS: tuple[tuple[str, float | None, float | None], ...] = (
    ("H100 PCIe", 756.0, 1513.0),
    ("H100 NVL", 835.0, 1671.0),
    ("GB200", GB200.bf16_tflops, GB200.fp8_tflops),
    ("B300", B300.bf16_tflops, B300.fp8_tflops),
    ("B200", B200.bf16_tflops, B200.fp8_tflops),
    ("H200", H200.bf16_tflops, H200.fp8_tflops),
    ("H100", H100.bf16_tflops, H100.fp8_tflops),
    ("A100", A100_40.bf16_tflops, A100_40.fp8_tflops),
    ("L40S", L40S.bf16_tflops, L40S.fp8_tflops),
    ("L4", L4.bf16_tflops, L4.fp8_tflops),
    ("A10G", A10G.bf16_tflops, A10G.fp8_tflops),
)


def peak_tflops(instance_type: str | None, dtype: str = "bf16",
                device_name: str | None = None) -> float | None:
    """Dense peak TFLOPS of one accelerator for `dtype` ("bf16" or "fp8"); None when unknown
    (CPU, an unlisted GPU, FP8 on a GPU without FP8 tensor cores).

    The SageMaker instance type wins (the catalog knows its accelerator); the pseudo types
    "local"/"local_gpu" and unknown types fall back to the CUDA device name.
    """
    if dtype not in ("bf16", "fp8"):
        raise ValueError(f"dtype must be 'bf16' or 'fp8', not {dtype!r}")
    known = get_instance_type(instance_type) if instance_type else None
    if known is not None and known.accelerator is not None:
        acc = known.accelerator
        return acc.bf16_tflops if dtype == "bf16" else acc.fp8_tflops
    if device_name:
        for key, bf16, fp8 in _DEVICE_PEAKS:
            if key.lower() in device_name.lower():
                return bf16 if dtype == "bf16" else fp8
    return None
