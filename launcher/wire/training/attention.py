"""Which kernel attends within documents (hyperparameter `attention_kernel`), decided once.

A packed row whose records mark their documents (docs/data.md) is attended by one of:

- `dense`: a boolean [B, 1, S, S] mask that PyTorch's SDPA applies: exact everywhere, S^2 bytes a
  row (256 MiB at 16K tokens), and it computes the masked blocks too. The CPU path.
- `flex`: FlexAttention with a block mask (torchtitan's way): only the blocks a document sees
  are computed, in any precision. Compiled for CUDA; PyTorch has no FlexAttention backward on CPU.
- `varlen`: flash attention over the documents as variable-length sequences
  (`torch.nn.attention.varlen`, Megatron/TE's `cu_seqlens` way): half precision (bf16) on CUDA
  only, as flash attention is.
- `auto` (the default): `flex` on a GPU, `dense` on a CPU.

Rows without documents are causal attention whatever this says (SDPA's flash kernel on GPUs).
The client checks what it can know before launch (`problem` with the instance's GPUs); the
container checks again with the device it really has, and resolves `auto` there.
"""

from __future__ import annotations

ATTENTION_KERNELS = ("auto", "dense", "flex", "varlen")
DEFAULT_ATTENTION_KERNEL = "auto"

DESCRIPTIONS = {
    "dense": "a dense [B, 1, S, S] mask through SDPA",
    "flex": "FlexAttention block masks",
    "varlen": "flash attention over variable-length documents",
}


def describe(kernel: str) -> str:
    """The kernel a job asked for, in words (`validate` prints it)."""
    if kernel == "auto":
        return f"attention_kernel auto: {DESCRIPTIONS['flex']} on GPUs, {DESCRIPTIONS['dense']} on CPUs"
    return f"attention_kernel {kernel}: {DESCRIPTIONS[kernel]}"


def resolve(kernel: str, gpu: bool) -> str:
    """The kernel that runs: `auto` is FlexAttention on a GPU and the dense mask on a CPU."""
    if kernel == "auto":
        return "flex" if gpu else "dense"
    return kernel


def problem(kernel: str, bf16: bool, gpu: bool | None) -> tuple[str, str] | None:
    """(what is wrong, the fix) when `kernel` cannot train here, else None. `gpu`: whether the
    job's devices are GPUs (None: not known, as for a local job before it starts)."""
    if kernel in ("flex", "varlen") and gpu is False:
        what = "FlexAttention has no backward pass on CPU" if kernel == "flex" else (
            "flash attention runs on NVIDIA GPUs only")
        return f"{what}, and this job trains on CPUs", "use attention_kernel: auto (dense on CPUs) or dense"
    if kernel == "varlen" and not bf16:
        return ("flash attention's variable-length kernel is half precision only, and this job trains in float32",
                "add bf16: 1, or use attention_kernel: flex (any precision)")
    return None
