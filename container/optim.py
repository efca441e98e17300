"""Optimizers, learning-rate schedule and gradient clipping, all DTensor-safe (FSDP2 makes every
parameter and gradient a DTensor).

`AnyPrecisionAdamW` is the FSDP seed's memory-saving optimizer (TorchDistX's AnyPrecision):
pure-bf16 parameters and states, with Kahan-compensated updates so that steps smaller than
half a bf16 ulp of the weight are not lost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from launcher.wire.training.speed import (
    FOREACH,
    FUSED,
    OPTIMIZER_CAN_RUN,
    default_optimizer_implementation,
    optimizer_implementation_problem,
)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight matrices (ndim >= 2, embeddings included) decay; norm weights and biases do not:
    shrinking a norm's gain or a bias toward zero is not regularisation, it changes the function. An empty
    group is left out (LoRA's adapters are all matrices): a checkpoint's optimizer state cannot load into one."""
    decay, no_decay = [], []
    for p in model.parameters():  # deduplicated, so tied weights appear once
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                    kind: str = "adamw", implementation: str | None = None) -> torch.optim.Optimizer:
    """torch's AdamW ("adamw"; states in the parameters' dtype; its fused and foreach paths run on
    DTensor parameters, even on several meshes) or "anyprecision" (bf16 states, Kahan summation).
    `implementation`: fused, foreach or for-loop (launcher.wire.training.speed); None: the default for
    the parameters' device."""
    if kind not in OPTIMIZER_CAN_RUN:
        raise ValueError(f"optimizer kind must be 'adamw' or 'anyprecision', not {kind!r}")
    groups = param_groups(model, weight_decay)
    device = next((p.device for group in groups for p in group["params"]), torch.device("cpu"))
    implementation = implementation or default_optimizer_implementation(kind, device.type)
    if problem := optimizer_implementation_problem(kind, implementation):
        raise ValueError(str(problem))
    if kind == "anyprecision":
        return AnyPrecisionAdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if implementation == FUSED:
        _check_fused_device(device)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=implementation == FUSED, foreach=implementation == FOREACH)


def _check_fused_device(device: torch.device) -> None:
    """torch's fused AdamW has kernels for some devices only; asked for elsewhere, it is refused here
    with the fix rather than in torch's words."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    supported = _get_fused_kernels_supported_devices()
    if device.type not in supported:
        raise ValueError(f"optimizer_implementation=fused: torch {torch.__version__} has no fused AdamW for "
                         f"{device.type} parameters (it has for {', '.join(supported)}); use "
                         "optimizer_implementation=foreach")


class AnyPrecisionAdamW(torch.optim.Optimizer):
    """AdamW with states in chosen dtypes and Kahan-summed parameter updates.

    With bf16 parameters, p + update rounds to p whenever |update| < half an ulp of p (for
    |p| ~ 1 anything below 2e-3): plain bf16 AdamW stalls. Kahan summation keeps the part of
    each update that rounding dropped in a compensation buffer and adds it to the next one.
    The weight decay goes through the same compensated sum (p·(1 - lr·wd) alone would round
    back to p). Only elementwise ops, so DTensor parameters (any mesh) work unchanged.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, use_kahan_summation: bool = True,
                 momentum_dtype: torch.dtype = torch.bfloat16, variance_dtype: torch.dtype = torch.bfloat16,
                 compensation_buffer_dtype: torch.dtype = torch.bfloat16):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid AnyPrecisionAdamW settings: lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "use_kahan_summation": use_kahan_summation, "momentum_dtype": momentum_dtype,
                    "variance_dtype": variance_dtype, "compensation_buffer_dtype": compensation_buffer_dtype}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            kahan = group["use_kahan_summation"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AnyPrecisionAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    # step on the CPU as torch's AdamW keeps it, so checkpoints look alike
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=group["momentum_dtype"])
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=group["variance_dtype"])
                    if kahan:
                        state["compensation"] = torch.zeros_like(p, dtype=group["compensation_buffer_dtype"])
                state["step"] += 1
                step = state["step"].item()
                grad, exp_avg, exp_avg_sq = p.grad, state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = lr / (1 - beta1 ** step)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
                if kahan:
                    comp = state["compensation"]
                    if wd:
                        comp.add_(p, alpha=-lr * wd)
                    comp.addcdiv_(exp_avg, denom, value=-step_size)
                    before = p.detach().clone()
                    p.add_(comp)
                    comp.add_(before.sub_(p))  # what rounding kept out of p (exact: Sterbenz)
                else:
                    if wd:
                        p.mul_(1 - lr * wd)
                    p.addcdiv_(exp_avg, denom, value=-step_size)
        return loss


def lr_schedule(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, min_lr: float,
                style: str = "cosine") -> LambdaLR:
    """Linear warm-up to each group's lr over `warmup_steps` (the first step runs at
    lr/warmup_steps, not 0), then cosine or linear decay to `min_lr` at `total_steps`, min_lr
    after; "constant" holds lr after the warm-up. Call `scheduler.step()` after each
    optimizer step."""
    if style not in ("cosine", "linear", "constant"):
        raise ValueError(f"lr decay style must be cosine, linear or constant, not {style!r}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1 (got {warmup_steps}, {total_steps})")

    def factor_for(base_lr: float):
        floor = min_lr / base_lr if base_lr else 0.0

        def factor(done: int) -> float:  # `done` optimizer steps taken before this one
            if done < warmup_steps:
                return (done + 1) / warmup_steps
            if style == "constant":
                return 1.0
            progress = min(1.0, (done - warmup_steps) / max(1, total_steps - warmup_steps))
            shape = 0.5 * (1 + math.cos(math.pi * progress)) if style == "cosine" else 1 - progress
            return floor + (1 - floor) * shape

        return factor

    return LambdaLR(optimizer, [factor_for(g["lr"]) for g in optimizer.param_groups])


def warmup_steps_from_fraction(warmup: float, lr_decay_iters: int) -> int:
    """The seed's (Megatron's) `warmup`: a fraction of `lr_decay_iters`."""
    return int(warmup * lr_decay_iters)


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0,
                    foreach: bool | None = None, pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Scale gradients so their global norm is at most max_norm; returns that norm (a plain
    tensor, the same on every rank). max_norm <= 0 only measures: the seed's `grad_clip 0`
    means no clipping.

    torch.nn.utils.clip_grad_norm_ stacks the per-tensor norms, which fails when DTensor
    gradients live on different meshes (e.g. FSDP-only and FSDP×TP parameters). Here each
    mesh's gradients get one norm (reduced over that mesh's shards, then a plain tensor via
    `full_tensor()`), and the per-mesh norms are combined locally. Under pipeline parallelism each
    rank holds only its stages' parameters: `pp_group` combines the stages' norms, so every stage
    clips with the whole model's norm.
    """
    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for p in params:
        by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    if not by_mesh and pp_group is None:
        return torch.tensor(0.0)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type, foreach=foreach)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    norms = norms or [torch.zeros((), device=_device(pp_group))]  # a stage without gradients adds nothing
    if len(norms) == 1:  # one mesh (or none): its norm is the total; no stack and norm of one value per step
        total = norms[0].to(torch.float32)
    else:
        device = norms[-1].device
        norms = torch.stack([n.to(device, torch.float32) for n in norms])
        total = norms.max() if math.isinf(norm_type) else torch.linalg.vector_norm(norms, norm_type)
    if pp_group is not None:
        total = _combine_stages(total, norm_type, pp_group)
    if max_norm > 0:
        for group in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=foreach)
    return total


def _combine_stages(norm: torch.Tensor, norm_type: float, group: dist.ProcessGroup) -> torch.Tensor:
    """The norm over every pipeline stage's gradients from each stage's own norm."""
    if math.isinf(norm_type):
        dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=group)
        return norm
    powered = norm ** norm_type
    dist.all_reduce(powered, group=group)
    return powered ** (1.0 / norm_type)


def _device(group: dist.ProcessGroup | None) -> torch.device:
    """Where a collective over `group` wants its tensors: the accelerator under NCCL."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
