"""Step time, tokens/s and dollars of a job: compute from FLOPs and a calibrated efficiency, plus
the communication compute does not hide (launcher.plan.comms), plus the pipeline bubble.

FLOPs per token are the runtime's own (`launcher.wire.training.flops`), so the plan and the training logs
agree: 6·N + 6·L·H·d_head·S (causal attention halved), N = the matmul weights including the LM
head. The seed's formula is reported beside it. Per optimizer step, on one rank:

    compute  = tokens per rank x FLOPs per token x r / (tp x pp) / (η x peak TFLOPS x 1e12)
    step     = (compute + exposed FSDP + exposed CP + TP) / (1 - pipeline bubble)
    tokens/s = tokens per step / step

r is the recompute factor: full activation checkpointing runs each block's forward twice, so
the hardware does (F + F_fwd,blocks)/F of the useful FLOPs (F_fwd,blocks = 2·N_blocks +
2·L·H·d_head·S); selective checkpointing recomputes only elementwise ops (r = 1). η is the
hardware FLOPs utilisation of the compute alone, one per accelerator generation and dtype: the
geometric mean of the η each of its published runs needs once the communication model has
taken its share (`CALIBRATION`; docs/planner.md has the table of predicted against published).
A GPU with its calibration GPU's compute (A100 40GB on p4d, H200) counts as calibrated; other
NVIDIA GPUs borrow the η of their generation (bf16: compute capability 8.x A100's, 9.0 and later
H100's; FP8 on any GPU: the p5 FP8 run, the only FP8 calibration) and are flagged uncalibrated,
which the plan says. Trainium, pre-Ampere GPUs, CPUs, fp32 training, MoE models, and groups that
cross a link the catalog has no bandwidth for (g7/g7e across hosts) get no throughput estimate,
and `estimate_or_reason` says which of these it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from launcher.config import ValidatedJob
from launcher.plan.comms import Communication, LayerCompute, UnknownLink, pass_communication
from launcher.plan.workload import Workload, workload_of
from launcher.wire.training.catalog import InstanceType, get_instance_type
from launcher.wire.training.flops import flops_per_token, matmul_params, seed_flops_per_token
from launcher.wire.training.layout import ParallelLayout
from launcher.wire.training.models import PRESETS, ModelSpec


@dataclass(frozen=True)
class CalibrationPoint:
    """A published run: a job FSDP-sharded over all its GPUs (torchtitan's 1D, the seed's hsd 8 on
    one host), and the tokens/s per GPU it reached."""

    label: str
    instance_type: str  # whose accelerator and links ran it (peak TFLOPS, bandwidths from the catalog)
    instance_count: int
    dtype: str  # "bf16" or "fp8"
    preset: str
    seq_len: int
    micro_batch: int
    cp: int
    ac_mode: str | None
    tokens_per_s_per_gpu: float
    source: str
    fitted: bool = True  # False: a cross-check the fit does not see
    tp: int = 1

    def workload(self) -> Workload:
        inst = get_instance_type(self.instance_type)
        world = inst.accelerators * self.instance_count
        return Workload(
            spec=PRESETS[self.preset], seq_len=self.seq_len, micro_batch=self.micro_batch, grad_accum=1,
            layout=ParallelLayout(world, 1, world // (self.cp * self.tp), self.cp, self.tp), compute_bytes=2, fsdp=True,
            ac_mode=self.ac_mode, offload=False, offload_horizon=0, reshard_after_forward=True,
            delayed_init=True, optimizer="adamw", fp8=self.dtype == "fp8", fp8_backend="transformer_engine",
            cp_comm_type="p2p", loss_chunk_tokens=0, microbatches=1, in_flight=1, bubble=0.0,
            instance=inst, instance_count=self.instance_count, processes_per_host=inst.accelerators)

    @property
    def efficiency(self) -> float:
        """The generation's η (at infinite width) that makes the model predict this run's tokens/s
        exactly: the solved utilisation over the model's width factor."""
        w = self.workload()
        return solve_efficiency(w, self.tokens_per_s_per_gpu) / width_factor(w.spec)


_SEED = "docs/seed-runs.md, the seed's p5.48xlarge CP 8 run"
_TITAN_H100 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
_TITAN_A100 = "pytorch/torchtitan docs/performance.md, Llama 3 on 64 A100 80GB, FSDP2"
# Llama 3 8B has the shapes of the llama3.1-8b preset (RoPE scaling does not change FLOPs).
CALIBRATION: tuple[CalibrationPoint, ...] = (
    CalibrationPoint("seed p5 bf16", "ml.p5.48xlarge", 1, "bf16", "llama3.1-8b", 16384, 4, 8, "full",
                     2.03 * 16384 / 8, f"{_SEED}: 2.03 samples/s"),
    CalibrationPoint("seed p5 fp8", "ml.p5.48xlarge", 1, "fp8", "llama3.1-8b", 16384, 4, 8, "full",
                     3.05 * 16384 / 8, f"{_SEED} with FP8: 3.05 samples/s"),
    CalibrationPoint("torchtitan H100 8 GPUs", "ml.p5.48xlarge", 1, "bf16", "llama3.1-8b", 8192, 2, 1,
                     "selective", 5762, f"{_TITAN_H100}, Table 1, FSDP (eager)"),
    CalibrationPoint("torchtitan H100 128 GPUs", "ml.p5.48xlarge", 16, "bf16", "llama3.1-8b", 8192, 2, 1,
                     "selective", 5605, f"{_TITAN_H100}, Table 3, FSDP (eager)"),
    CalibrationPoint("torchtitan A100 8B", "ml.p4de.24xlarge", 8, "bf16", "llama3.1-8b", 8192, 1, 1,
                     "selective", 2973, f"{_TITAN_A100}: 8B, batch 1, selective op AC"),
    CalibrationPoint("torchtitan A100 70B", "ml.p4de.24xlarge", 8, "bf16", "llama3.1-70b", 8192, 1, 1,
                     "full", 331, f"{_TITAN_A100}: 70B, batch 1, full AC"),
    # Not fitted: checks the width factor at h 16384 and the TP model (FSDP 16 x TP 8 inside hosts).
    CalibrationPoint("torchtitan H100 405B", "ml.p5.48xlarge", 16, "bf16", "llama3.1-405b", 8192, 2, 1,
                     "full", 109, "pytorch/torchtitan docs/performance.md: Llama 3.1 405B on 128 H100, "
                     "FSDP2 + TP 8, batch 2, full AC, no Float8", fitted=False, tp=8),
)


# Matmuls use a GPU better the wider they are (more work per byte moved, fewer partial tiles):
# the utilisation of a model of hidden size h is η x h / (h + WIDTH_HALF). One constant for every
# generation, solved from torchtitan's two A100 runs of one setup (8B, h 4096, runs at 0.520 of
# peak; 70B, h 8192, at 0.643), rounded; torchtitan's 405B on 128 H100 (h 16384, not fitted) checks it
# (docs/planner.md).
WIDTH_HALF = 2500


def width_factor(spec: ModelSpec) -> float:
    return spec.hidden_size / (spec.hidden_size + WIDTH_HALF)


def recompute_factor(spec: ModelSpec, seq_len: float, ac_mode: str | None, ac_freq: int = 1) -> float:
    """Hardware FLOPs over useful FLOPs: 1 + (2·N_blocks + 2·L·H·d_head·S) / F for full
    activation checkpointing (the blocks' forward runs again in backward); selective_op recomputes
    every other matmul (Llama's wk, wo, w3; GPT-NeoX's wo, w2), 2·N_recomputed·L / F; selective
    nothing of note, 1. With activation_checkpointing_freq f, 1/f of the layers recompute."""
    h, d = spec.hidden_size, spec.head_dim
    if ac_mode == "full":
        blocks = matmul_params(spec) - spec.hidden_size * spec.vocab_size
        forward = 2 * blocks + 2 * spec.num_layers * spec.num_heads * d * seq_len
    elif ac_mode == "selective_op" and not spec.is_moe:
        if spec.gated_mlp:
            recomputed = h * spec.num_kv_heads * d + spec.num_heads * d * h + h * spec.intermediate_size
        else:
            recomputed = spec.num_heads * d * h + spec.intermediate_size * h
        forward = 2 * recomputed * spec.num_layers
    else:
        return 1.0
    return 1 + forward * (spec.num_layers // ac_freq) / spec.num_layers / flops_per_token(spec, seq_len)


@dataclass(frozen=True)
class StepTime:
    """One optimizer step on one rank: compute, the exposed part of each parallelism's
    communication, and the pipeline bubble, in seconds."""

    compute_s: float
    communication: tuple[Communication, ...]
    bubble_s: float

    @property
    def communication_s(self) -> float:
        return sum(c.exposed_s for c in self.communication)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s + self.bubble_s

    @property
    def parts(self) -> dict[str, float]:
        return {"compute": self.compute_s, "communication": self.communication_s, "bubble": self.bubble_s}

    @property
    def bound_by(self) -> str:
        """What takes the largest share of the step: compute, communication or bubble."""
        return max(self.parts, key=self.parts.get)


def step_time(w: Workload, eta: float, peak_tflops: float) -> StepTime:
    """Raises UnknownLink where a group crosses a link the catalog has no bandwidth for."""
    spec, lay = w.spec, w.layout
    flops = flops_per_token(spec, w.attention_len)
    r = recompute_factor(spec, w.attention_len, w.ac_mode, w.ac_freq)
    rate = eta * peak_tflops * 1e12
    pass_s = w.tokens_per_rank * flops * r / (lay.tp * lay.pp) / rate  # one micro-batch's forward + backward
    layers = math.ceil(spec.num_layers / lay.pp)
    attention = (flops - 6 * matmul_params(spec)) / spec.num_layers  # per token per block, fwd + bwd
    attention_s = w.tokens_per_rank * attention / lay.tp / rate
    recomputed = (spec.num_layers // w.ac_freq) / spec.num_layers / 3 if w.ac_mode == "full" else 0.0
    layer = LayerCompute(forward_s=pass_s / (3 * r) / layers, backward_s=pass_s * (1 - 1 / (3 * r)) / layers,
                         attention_forward_s=attention_s / 3, attention_backward_s=attention_s * (2 / 3 + recomputed))
    passes = w.microbatches if lay.pp > 1 else w.grad_accum
    comms = tuple(c.times(passes) for c in pass_communication(w, layer))
    busy = pass_s * passes + sum(c.exposed_s for c in comms)
    return StepTime(pass_s * passes, comms, busy * w.bubble / (1 - w.bubble))


def solve_efficiency(w: Workload, tokens_per_s_per_gpu: float) -> float:
    """The η at which the model predicts `tokens_per_s_per_gpu` for w (bisection: the prediction
    grows with η); ValueError if communication alone is slower than that."""
    peak = _peak(w.instance, "fp8" if w.fp8 else "bf16")

    def predicted(eta: float) -> float:
        return w.tokens_per_step / w.world / step_time(w, eta, peak).step_s

    low, high = 1e-3, 1.0
    if predicted(high) < tokens_per_s_per_gpu:
        raise ValueError(f"{tokens_per_s_per_gpu:,.0f} tokens/s per GPU is out of the model's reach at η = 1")
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if predicted(mid) < tokens_per_s_per_gpu else (low, mid)
    return (low + high) / 2


def _generation(instance: InstanceType, dtype: str) -> tuple[str, str]:
    """The calibrated generation whose η an accelerator takes: in bf16 A100's below compute capability
    9.0, H100's from it; in FP8 H100's on every GPU (Ada's L4 and L40S too), the only FP8 runs."""
    newer = dtype == "fp8" or instance.accelerator.compute_capability >= (9, 0)
    return ("H100" if newer else "A100", dtype)


@cache
def fitted_efficiency(generation: tuple[str, str]) -> tuple[float, tuple[str, ...]]:
    """(η of an accelerator generation and dtype: the geometric mean over its fitted points,
    the labels of those points)."""
    points = [p for p in CALIBRATION if p.fitted
              and _generation(get_instance_type(p.instance_type), p.dtype) == generation]
    eta = math.exp(sum(math.log(p.efficiency) for p in points) / len(points))
    return eta, tuple(p.label for p in points)


def no_efficiency(instance: InstanceType | None, dtype: str) -> str | None:
    """Why no calibrated η applies to this instance in this dtype, or None where one does."""
    acc = instance.accelerator if instance else None
    if acc is None:
        return f"{instance.name if instance else 'this machine'} has no accelerator the planner has figures for"
    if acc.compute_capability is None:
        return f"{acc.model}: every calibration run is an NVIDIA GPU's (docs/planner.md)"
    if acc.compute_capability < (8, 0) or _peak(instance, dtype) is None:
        return f"{acc.model} has no {dtype} tensor cores"
    return None


def efficiency_for(instance: InstanceType | None, dtype: str) -> tuple[float, str, bool] | None:
    """(η, the calibration points it comes from, whether they ran on the same compute: same
    compute capability and peak, e.g. A100 40GB from the A100 80GB points, H200 from H100); None
    where no_efficiency says why not."""
    if no_efficiency(instance, dtype) is not None:
        return None
    acc = instance.accelerator
    generation = _generation(instance, dtype)
    eta, labels = fitted_efficiency(generation)
    ran_on = next(get_instance_type(p.instance_type).accelerator for p in CALIBRATION if p.label == labels[0])
    calibrated = (acc.compute_capability, acc.bf16_tflops) == (ran_on.compute_capability, ran_on.bf16_tflops)
    return eta, f"{generation[0]} {dtype}: " + ", ".join(labels), calibrated


@dataclass(frozen=True)
class ThroughputEstimate:
    flops_per_token: float  # useful FLOPs, the runtime's formula
    seed_flops_per_token: float  # the seed's (Megatron) formula, for comparison with its logs
    formula: str
    tokens_per_step: int
    recompute_factor: float
    efficiency: float  # η, hardware utilisation of the compute alone, recomputation included
    peak_tflops: float  # per GPU, dense, in the dtype trained in
    dtype: str
    basis: str  # the calibration points η comes from
    calibrated: bool
    accelerator: str  # the GPU's model, as the catalog names it
    world: int
    usd_per_hour: float | None  # instance price x count; None where the catalog has no rate
    step: StepTime

    @property
    def borrowed(self) -> str | None:
        """What an uncalibrated estimate rests on (None where its own GPU calibrates it)."""
        if self.calibrated:
            return None
        return (f"uncalibrated: no published {self.dtype} run on the {self.accelerator}; its η is borrowed "
                f"from {self.basis}")

    @property
    def step_s(self) -> float:
        return self.step.step_s

    @property
    def compute_s(self) -> float:
        return self.step.compute_s

    @property
    def communication_s(self) -> float:
        """Communication compute does not hide, per step."""
        return self.step.communication_s

    @property
    def bubble_s(self) -> float:
        return self.step.bubble_s

    @property
    def bound_by(self) -> str:
        return self.step.bound_by

    @property
    def tokens_per_s(self) -> float:
        """The whole job's tokens per second."""
        return self.tokens_per_step / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.world

    @property
    def tflops_per_gpu(self) -> float:
        return self.tokens_per_s_per_gpu * self.flops_per_token / 1e12

    @property
    def tflops_per_gpu_seed_formula(self) -> float:
        return self.tokens_per_s_per_gpu * self.seed_flops_per_token / 1e12

    @property
    def mfu(self) -> float:
        """Useful FLOPs over peak, communication and bubble included."""
        return self.tflops_per_gpu / self.peak_tflops

    @property
    def usd_per_billion_tokens(self) -> float | None:
        if self.usd_per_hour is None:
            return None
        return self.usd_per_hour / (self.tokens_per_s * 3600) * 1e9

    def cost_for(self, tokens: float | None = None, steps: float | None = None) -> tuple[float, float | None]:
        """(hours, dollars) to train `tokens` tokens or `steps` optimizer steps (exactly one)."""
        if (tokens is None) == (steps is None):
            raise ValueError("give tokens or steps, not both and not neither")
        if tokens is None:
            tokens = steps * self.tokens_per_step
        hours = tokens / self.tokens_per_s / 3600
        return hours, None if self.usd_per_hour is None else hours * self.usd_per_hour

    def to_dict(self) -> dict:
        return {
            "tokens_per_s": round(self.tokens_per_s, 1),
            "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
            "step_s": round(self.step_s, 4),
            "compute_s": round(self.compute_s, 4),
            "communication_s": round(self.communication_s, 4),
            "bubble_s": round(self.bubble_s, 4),
            "bound_by": self.bound_by,
            "communication": {c.name: c.to_dict() for c in self.step.communication},
            "tokens_per_step": self.tokens_per_step,
            "flops_per_token": self.flops_per_token,
            "seed_flops_per_token": self.seed_flops_per_token,
            "formula": self.formula,
            "tflops_per_gpu": round(self.tflops_per_gpu, 1),
            "tflops_per_gpu_seed_formula": round(self.tflops_per_gpu_seed_formula, 1),
            "mfu": round(self.mfu, 4),
            "efficiency": round(self.efficiency, 4),
            "recompute_factor": round(self.recompute_factor, 4),
            "peak_tflops": self.peak_tflops,
            "dtype": self.dtype,
            "calibration": self.basis,
            "calibrated": self.calibrated,
            "uncalibrated": self.borrowed,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_billion_tokens": None if self.usd_per_billion_tokens is None
            else round(self.usd_per_billion_tokens, 2),
        }


def estimate_throughput(job: ValidatedJob) -> ThroughputEstimate | None:
    """Tokens/s, step time and cost of a validated job; None where no efficiency applies (see
    estimate_workload). Raises PlanError when the model or the world size is unknown."""
    return estimate_workload(workload_of(job))


def estimate_workload(w: Workload) -> ThroughputEstimate | None:
    """None where no efficiency applies (CPU/local, Trainium, pre-Ampere, fp32, MoE) or a group
    crosses a link without a bandwidth in the catalog (estimate_or_reason says which)."""
    found = estimate_or_reason(w)
    return found if isinstance(found, ThroughputEstimate) else None


def estimate_or_reason(w: Workload) -> ThroughputEstimate | str:
    """The estimate, or why there is none."""
    dtype = "fp8" if w.fp8 else "bf16"
    found = efficiency_for(w.instance, dtype)
    if found is None:
        return no_efficiency(w.instance, dtype)
    if w.compute_bytes != 2:
        return "fp32 training: every calibration run trained in bf16 or FP8"
    if w.spec.is_moe:
        return "a mixture-of-experts model: every calibration run is a dense model's"
    eta, basis, calibrated = found
    eta *= width_factor(w.spec)
    peak = _peak(w.instance, dtype)
    try:
        step = step_time(w, eta, peak)
    except UnknownLink as exc:
        return f"{exc}, which a parallel group crosses"
    spec, seq = w.spec, w.seq_len
    flops = flops_per_token(spec, w.attention_len)
    n = matmul_params(spec)
    formula = (f"6·N + 6·L·H·d_head·S (causal) = 6 x {n:,} + 6 x {spec.num_layers} x {spec.num_heads} x "
               f"{spec.head_dim} x {w.attention_len:,.0f} = {flops / 1e9:.2f} GFLOP/token")
    if w.attended_basis:
        formula += f" (S: {w.attended_basis})"
    price = w.instance.usd_per_hour
    return ThroughputEstimate(
        flops_per_token=flops,
        seed_flops_per_token=seed_flops_per_token(spec, seq),
        formula=formula,
        tokens_per_step=w.tokens_per_step,
        recompute_factor=recompute_factor(spec, w.attention_len, w.ac_mode, w.ac_freq),
        efficiency=eta,
        peak_tflops=peak,
        dtype=dtype,
        basis=basis,
        calibrated=calibrated,
        accelerator=w.instance.accelerator.model,
        world=w.world,
        usd_per_hour=None if price is None else price * w.instance_count,
        step=step,
    )


def _peak(instance: InstanceType | None, dtype: str) -> float | None:
    acc = instance.accelerator if instance else None
    if acc is None:
        return None
    return acc.bf16_tflops if dtype == "bf16" else acc.fp8_tflops

