"""Step time, tokens/s and dollars of a job, from FLOPs per token and a calibrated efficiency.

FLOPs per token are the runtime's own (`launcher.flops`), so the plan and the
training logs agree: 6·N + 6·L·H·d_head·S (causal attention halved), N = the matmul weights
including the LM head. The seed's formula is reported beside it.

    tokens/s per GPU = η · peak TFLOPS · 1e12 / (FLOPs per token · r)

r is the recompute factor: full activation checkpointing runs each block's forward twice, so
the hardware does (F + F_fwd,blocks)/F of the useful FLOPs (F_fwd,blocks = 2·N_blocks +
2·L·H·d_head·S, a third of the blocks' training FLOPs); selective checkpointing recomputes only
elementwise ops (r = 1). η is the hardware FLOPs utilisation (recomputation included) of an
accelerator generation and dtype, solved from published runs:

| accelerator | dtype | run (source) | seq | cp | AC | tokens/s/GPU | MFU | η |
|---|---|---|---|---|---|---|---|---|
| H100 (p5) | bf16 | seed, p5.48xlarge, Llama 3.1 8B, batch 4, 2.03 samples/s (docs/seed-runs.md) | 16384 | 8 | full | 4,157 | 24.3% | 0.320 |
| H100 (p5) | fp8 | seed, same with TE FP8, 3.05 samples/s (docs/seed-runs.md) | 16384 | 8 | full | 6,246 | 18.3% of FP8 peak | 0.240 |
| A100 (p4d) | bf16 | torchtitan docs/performance.md (2024): Llama 3 8B, FSDP2, 64 A100 80GB, batch 1, selective op AC, 2,973 WPS | 8192 | 1 | selective | 2,973 | 49.0% | 0.490 |
| H100 | bf16 | cross-check only: torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Llama 3.1 8B, FSDP, 8 GPUs, batch 2, selective AC, eager: 5,762 TPS/GPU (H100 HBM2e at 500 W) | 8192 | 1 | selective | 5,762 | 30.0% | 0.300 |

MFU here is useful FLOPs (the causal formula) over the dense peak of the dtype trained in; the
seed's 247 and 372 TFLOPS/GPU are the same runs counted with the seed's formula (+3% at 16K).
Calibrating on tokens/s keeps both formulas consistent: the plan reproduces the runs' tokens/s
exactly, whichever formula reports TFLOPS. The H100 cross-check is predicted 6,150 (+7%): its
GPUs ran at 500 W. The two H100 bf16 points show no context-parallel penalty once recomputation
is counted (η 0.32 at cp 8 against 0.30 at cp 1), so none is modelled; nor is inter-node or
tensor-parallel communication (no published point for this stack). A GPU with its calibration
GPU's compute (A100 40GB on p4d, H200) counts as calibrated; other NVIDIA GPUs borrow the η of
their generation (compute capability 8.x: A100's; 9.0 and later: H100's; FP8: the p5 FP8 point)
and are flagged uncalibrated. Trainium, pre-Ampere GPUs, CPUs, fp32 training and MoE models get
no throughput estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.catalog import InstanceType, get_instance_type
from launcher.config import ValidatedJob
from launcher.config.models import PRESETS, ModelSpec
from launcher.flops import flops_per_token, matmul_params, seed_flops_per_token
from launcher.plan.workload import Workload, workload_of


@dataclass(frozen=True)
class CalibrationPoint:
    label: str
    instance_type: str  # whose accelerator ran it (peak TFLOPS from the catalog)
    dtype: str  # "bf16" or "fp8"
    preset: str
    seq_len: int
    cp: int
    ac_mode: str | None
    tokens_per_s_per_gpu: float
    source: str

    @property
    def efficiency(self) -> float:
        """η: hardware FLOPs (recomputation included) over the dense peak."""
        spec, inst = PRESETS[self.preset], get_instance_type(self.instance_type)
        flops = flops_per_token(spec, self.seq_len) * recompute_factor(spec, self.seq_len, self.ac_mode)
        return self.tokens_per_s_per_gpu * flops / (_peak(inst, self.dtype) * 1e12)


CALIBRATION: tuple[CalibrationPoint, ...] = (
    CalibrationPoint("seed p5 bf16", "ml.p5.48xlarge", "bf16", "llama3.1-8b", 16384, 8, "full",
                     2.03 * 16384 / 8, "docs/seed-runs.md, the seed's p5.48xlarge CP 8 run: 2.03 samples/s"),
    CalibrationPoint("seed p5 fp8", "ml.p5.48xlarge", "fp8", "llama3.1-8b", 16384, 8, "full",
                     3.05 * 16384 / 8, "docs/seed-runs.md, the seed's p5.48xlarge CP 8 FP8 run: 3.05 samples/s"),
    # Llama 3 8B has the shapes of the llama3.1-8b preset (RoPE scaling does not change FLOPs).
    CalibrationPoint("torchtitan A100", "ml.p4de.24xlarge", "bf16", "llama3.1-8b", 8192, 1, "selective",
                     2973, "pytorch/torchtitan docs/performance.md, Llama 3 8B on 64 A100 80GB, FSDP2"),
)
CROSS_CHECK = CalibrationPoint(
    "torchtitan H100", "ml.p5.48xlarge", "bf16", "llama3.1-8b", 8192, 1, "selective", 5762,
    "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1, FSDP eager")


def recompute_factor(spec: ModelSpec, seq_len: int, ac_mode: str | None) -> float:
    """Hardware FLOPs over useful FLOPs: 1 + (2·N_blocks + 2·L·H·d_head·S) / F for full
    activation checkpointing (the blocks' forward runs again in backward), else 1."""
    if ac_mode != "full":
        return 1.0
    blocks = matmul_params(spec) - spec.hidden_size * spec.vocab_size
    forward = 2 * blocks + 2 * spec.num_layers * spec.num_heads * spec.head_dim * seq_len
    return 1 + forward / flops_per_token(spec, seq_len)


def efficiency_for(instance: InstanceType | None, dtype: str) -> tuple[float, str, bool] | None:
    """(η, the calibration point it comes from, whether that point ran on the same compute: same
    compute capability and peak, e.g. A100 40GB from the A100 80GB point, H200 from H100)."""
    acc = instance.accelerator if instance else None
    if acc is None or acc.compute_capability is None or acc.compute_capability < (8, 0) \
            or _peak(instance, dtype) is None:
        return None
    if dtype == "fp8":
        label = "seed p5 fp8"
    else:
        label = "torchtitan A100" if acc.compute_capability < (9, 0) else "seed p5 bf16"
    point = next(p for p in CALIBRATION if p.label == label)
    ran_on = get_instance_type(point.instance_type).accelerator
    calibrated = (acc.compute_capability, acc.bf16_tflops) == (ran_on.compute_capability, ran_on.bf16_tflops)
    return point.efficiency, label, calibrated


@dataclass(frozen=True)
class ThroughputEstimate:
    flops_per_token: float  # useful FLOPs, the runtime's formula
    seed_flops_per_token: float  # the seed's (Megatron) formula, for comparison with its logs
    formula: str
    tokens_per_step: int
    recompute_factor: float
    efficiency: float  # η, hardware utilisation including recomputation
    mfu: float  # useful FLOPs over peak
    peak_tflops: float  # per GPU, dense, in the dtype trained in
    dtype: str
    basis: str  # calibration point label
    calibrated: bool
    world: int
    usd_per_hour: float | None  # instance price x count; None where the catalog has no rate

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.efficiency * self.peak_tflops * 1e12 / (self.flops_per_token * self.recompute_factor)

    @property
    def tokens_per_s(self) -> float:
        """The whole job's tokens per second."""
        return self.tokens_per_s_per_gpu * self.world

    @property
    def step_s(self) -> float:
        return self.tokens_per_step / self.tokens_per_s

    @property
    def tflops_per_gpu(self) -> float:
        return self.tokens_per_s_per_gpu * self.flops_per_token / 1e12

    @property
    def tflops_per_gpu_seed_formula(self) -> float:
        return self.tokens_per_s_per_gpu * self.seed_flops_per_token / 1e12

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
            "usd_per_hour": self.usd_per_hour,
            "usd_per_billion_tokens": None if self.usd_per_billion_tokens is None
            else round(self.usd_per_billion_tokens, 2),
        }


def estimate_throughput(job: ValidatedJob) -> ThroughputEstimate | None:
    """Tokens/s, step time and cost of a validated job; None where no efficiency applies (see
    estimate_workload). Raises PlanError when the model or the world size is unknown."""
    return estimate_workload(workload_of(job))


def estimate_workload(w: Workload) -> ThroughputEstimate | None:
    """None where no efficiency applies: CPU/local, Trainium, pre-Ampere, fp32, MoE."""
    dtype = "fp8" if w.fp8 else "bf16"
    found = efficiency_for(w.instance, dtype)
    if found is None or w.compute_bytes != 2 or w.spec.is_moe:
        return None
    eta, basis, calibrated = found
    if w.bubble:  # the pipeline's idle share of the step does no work
        eta, basis = eta * (1 - w.bubble), f"{basis}; x (1 - pipeline bubble {w.bubble:.3f})"
    spec, seq = w.spec, w.seq_len
    flops = flops_per_token(spec, seq)
    r = recompute_factor(spec, seq, w.ac_mode)
    n = matmul_params(spec)
    formula = (f"6·N + 6·L·H·d_head·S (causal) = 6 x {n:,} + 6 x {spec.num_layers} x {spec.num_heads} x "
               f"{spec.head_dim} x {seq} = {flops / 1e9:.2f} GFLOP/token")
    price = w.instance.usd_per_hour
    return ThroughputEstimate(
        flops_per_token=flops,
        seed_flops_per_token=seed_flops_per_token(spec, seq),
        formula=formula,
        tokens_per_step=w.tokens_per_step,
        recompute_factor=r,
        efficiency=eta,
        mfu=eta / r,
        peak_tflops=_peak(w.instance, dtype),
        dtype=dtype,
        basis=basis,
        calibrated=calibrated,
        world=w.world,
        usd_per_hour=None if price is None else price * w.instance_count,
    )


def _peak(instance: InstanceType | None, dtype: str) -> float | None:
    acc = instance.accelerator if instance else None
    if acc is None:
        return None
    return acc.bf16_tflops if dtype == "bf16" else acc.fp8_tflops
