"""Model shapes: the ModelSpec, smlaunch's presets and the Hub names they stand for.

Two families of blocks: Llama's (RMSNorm, RoPE, grouped-query attention, SwiGLU; Mistral is the
same block with a sliding attention window, Mixtral with a sparse mixture of experts for its
MLP) and GPT-NeoX's (LayerNorm with bias, biased projections, RoPE on part of each head, a GELU
MLP, attention and MLP side by side on the residual). `architecture` is the transformers
`model_type` the spec is exported as, so a spec says which Hugging Face model it equals.

The container builds its models from the same specs; the planner sizes memory from them
(`block_parameters`, `parameter_count`: tested against transformers' models). Specs from a
Hugging Face `config.json` are made in `hf_config.py`, from the seed script's size
hyperparameters in `model_resolution.py`.

Which kernel attends within documents (hyperparameter `attention_kernel`) is decided here too,
once (the section at the end): the client checks what it can know before launch, the container
checks again with the device it really has and resolves `auto` there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.wire.training.base import MAX_DIMENSION

# transformers' model_type of each architecture smlaunch's runtime builds
ARCHITECTURES = ("llama", "mistral", "mixtral", "gpt_neox")
# GPT-NeoX's activations (transformers' ACT2FN names): exact GELU, or its tanh approximation under
# three names that compute the same function
GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")
DIMENSIONS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings")


class ModelShapeError(ValueError):
    """A shape no model can have; `field` is the ModelSpec field, for callers to name their key."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(problem)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 500_000.0
    tie_embeddings: bool = False
    num_experts: int = 0
    norm_eps: float = 1e-5
    # MoE only (Mixtral's config keys and MixtralConfig's defaults): experts each token visits, and
    # the weight of the load-balancing auxiliary loss added to the training loss (docs/moe.md)
    experts_per_token: int = 2
    router_aux_loss_coef: float = 0.001
    # Llama 3.1 RoPE frequency scaling: (factor, low_freq_factor, high_freq_factor, original max positions)
    rope_scaling: tuple[float, float, float, int] | None = None
    # config.json's head_dim where it is not hidden_size / num_heads (None: that quotient)
    explicit_head_dim: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None  # Llama 3.1 Instruct lists several
    pad_token_id: int | None = None
    # transformers' model_type (ARCHITECTURES); an MoE spec exports as mixtral whatever it says
    architecture: str = "llama"
    # Mistral/Mixtral: each query attends to itself and the sliding_window - 1 keys before it
    # (transformers' sliding-window mask); None: the whole causal context
    sliding_window: int | None = None
    # GPT-NeoX only: the fraction of each head RoPE rotates (rotary_pct), the MLP's activation,
    # attention and MLP side by side on the residual (use_parallel_residual), biased q/k/v and output
    # projections (attention_bias; its MLP always has biases). Its norms are LayerNorms of norm_eps.
    rotary_pct: float = 1.0
    hidden_act: str = "silu"
    parallel_residual: bool = False
    attention_bias: bool = False
    # the standard deviation of the projections' initialisation (the output projections' is scaled
    # down with depth from it); the embedding and the head keep their own
    initializer_range: float = 0.02
    # What a config.json asks for that smlaunch's model does not implement, one "key: value" each;
    # the runtime (and validation, for smlaunch's train.py) refuses such a model by these names.
    unsupported: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Every consumer divides by these (head_dim, tp divisibility, the planner's per-rank terms).
        found = shape_problem(self)
        if found:
            raise ModelShapeError(*found)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def is_gpt_neox(self) -> bool:
        return self.architecture == "gpt_neox"

    @property
    def hf_model_type(self) -> str:
        """What the export's config.json says: an MoE Llama is a Mixtral, a Mixtral without experts
        a Mistral (its attention)."""
        if self.is_moe:
            return "mixtral"
        return "mistral" if self.architecture == "mixtral" else self.architecture

    @property
    def rotary_dim(self) -> int:
        """The leading dimensions of each head that RoPE rotates (transformers: int(head_dim * pct))."""
        return int(self.head_dim * self.rotary_pct)

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU (gate, up, down) rather than GPT-NeoX's two-matrix GELU MLP."""
        return not self.is_gpt_neox

    def block_matmul_parameters(self) -> int:
        """Weights of one block's matmuls: q, k, v, o and the MLP (every expert's, and the router)."""
        h = self.hidden_size
        attention = 2 * h * self.num_heads * self.head_dim + 2 * h * self.num_kv_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        if self.is_moe:
            mlp = self.num_experts * mlp + h * self.num_experts
        return attention + mlp

    def block_parameters(self) -> int:
        """Every parameter of one block: its matmuls, norms (GPT-NeoX's LayerNorms have biases) and biases."""
        h = self.hidden_size
        if not self.is_gpt_neox:
            return self.block_matmul_parameters() + 2 * h
        biases = self.intermediate_size + h + (3 * h + h if self.attention_bias else 0)
        return self.block_matmul_parameters() + 4 * h + biases

    def root_parameters(self) -> int:
        """The embedding, the final norm and (untied) the head."""
        norm = 2 * self.hidden_size if self.is_gpt_neox else self.hidden_size
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2) + norm

    def parameter_count(self) -> int:
        """All parameters, a tied head counted once (as transformers' num_parameters())."""
        return self.num_layers * self.block_parameters() + self.root_parameters()


# Megatron's --make-vocab-size-divisible-by default: a vocabulary tensor parallelism cannot split
# evenly is padded to a multiple of this (and of the degree), so the padded size is the same at
# every power-of-two degree and a checkpoint resumes at another one.
VOCAB_MULTIPLE = 128


def vocab_rows(vocab_size: int, tp: int, saved: int | None = None) -> int:
    """Rows of smlaunch's embedding and output head for `vocab_size` entries at tensor-parallel
    degree `tp`: the vocabulary itself when tp splits it evenly, else padded (the padding rows are
    never looked up, their logits are masked to -inf, the export drops them). `saved`, the rows of
    the checkpoint a run resumes, is kept where this degree splits it, so a resume at another
    degree loads the shapes it saved."""
    if saved is not None and saved >= vocab_size and saved % tp == 0:
        return saved
    if vocab_size % tp == 0:
        return vocab_size
    multiple = math.lcm(VOCAB_MULTIPLE, tp)
    return -(-vocab_size // multiple) * multiple


def _whole(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_DIMENSION


def shape_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) for the first impossible shape of `spec`, else None."""
    for key in DIMENSIONS:
        if not _whole(getattr(spec, key), 1):
            return key, f"{key} {getattr(spec, key)!r} is not a whole number from 1 to {MAX_DIMENSION}"
    if not _whole(spec.num_experts, 0):
        return "num_experts", f"num_experts {spec.num_experts!r} is not a whole number (0: a dense model)"
    if spec.is_moe and not (_whole(spec.experts_per_token, 1) and spec.experts_per_token <= spec.num_experts):
        return "experts_per_token", (f"{spec.experts_per_token!r} experts per token is not a whole number from 1 "
                                     f"to the model's {spec.num_experts} experts")
    coef = spec.router_aux_loss_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not (math.isfinite(coef) and coef >= 0):
        return "router_aux_loss_coef", f"router_aux_loss_coef {coef!r} is not a finite number of 0 or more"
    if spec.explicit_head_dim is not None and not _whole(spec.explicit_head_dim, 1):
        return "head_dim", f"head_dim {spec.explicit_head_dim!r} is not a whole number from 1 to {MAX_DIMENSION}"
    if spec.head_dim < 1:
        return "num_heads", (f"{spec.num_heads} attention heads leave no head dimension in a width of "
                             f"{spec.hidden_size}")
    if spec.num_heads % spec.num_kv_heads:
        return "num_kv_heads", (f"{spec.num_kv_heads} key/value heads do not divide {spec.num_heads} attention heads "
                                "(each key/value head serves a whole group of them)")
    for key in ("rope_theta", "norm_eps", "initializer_range"):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            return key, f"{key} {value!r} is not a finite number above 0"
    return _architecture_problem(spec)


def _architecture_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """What one architecture cannot be: each rule is what its transformers model would not build."""
    if spec.architecture not in ARCHITECTURES:
        return "architecture", f"architecture {spec.architecture!r} is none of {', '.join(ARCHITECTURES)}"
    if spec.sliding_window is not None:
        if not _whole(spec.sliding_window, 1):
            return "sliding_window", f"sliding_window {spec.sliding_window!r} is not a whole number from 1 to " \
                                     f"{MAX_DIMENSION}"
        if spec.hf_model_type not in ("mistral", "mixtral"):
            return "sliding_window", (f"a {spec.architecture} model attends over its whole causal context: "
                                      "sliding windows are Mistral's and Mixtral's")
    pct = spec.rotary_pct
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 1:
        return "rotary_pct", f"rotary_pct {pct!r} is not a fraction above 0 and at most 1"
    if not spec.is_gpt_neox:
        if pct != 1 or spec.hidden_act != "silu" or spec.parallel_residual or spec.attention_bias:
            return "architecture", (f"{spec.architecture} rotates whole heads with RoPE and has a SwiGLU MLP "
                                    "after the attention, without biases (rotary_pct, hidden_act, "
                                    "parallel_residual and attention_bias are GPT-NeoX's)")
        return None
    if spec.is_moe:
        return "num_experts", "GPT-NeoX has a dense MLP: num_experts must be 0"
    if spec.num_kv_heads != spec.num_heads:
        return "num_kv_heads", (f"GPT-NeoX has one key and one value head per attention head, not "
                                f"{spec.num_kv_heads} for {spec.num_heads}")
    if spec.explicit_head_dim is not None or spec.hidden_size % spec.num_heads:
        return "num_heads", (f"GPT-NeoX's heads split its width: {spec.num_heads} heads do not divide "
                             f"{spec.hidden_size}")
    if spec.rotary_dim < 2 or spec.rotary_dim % 2:
        return "rotary_pct", (f"rotary_pct {pct} rotates {spec.rotary_dim} of each head's {spec.head_dim} "
                              "dimensions; RoPE needs an even number of them, at least 2")
    if spec.hidden_act not in GELU_ACTIVATIONS:
        return "hidden_act", f"hidden_act {spec.hidden_act!r} is none of {', '.join(GELU_ACTIVATIONS)}"
    if spec.rope_scaling is not None:
        return "rope_scaling", "GPT-NeoX's RoPE takes no Llama 3 frequency scaling"
    return None


# Llama 3.1's RoPE scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
# AWS's script's defaults for rope_scaling_type llama3
LLAMA_ROPE_SCALING_DEFAULTS = (8.0, 1.0, 4.0, 8192)

# <|begin_of_text|> and <|end_of_text|> of the Llama 3 tokenizer (the base models' config.json).
LLAMA3_TOKENS = {"bos_token_id": 128000, "eos_token_id": 128001}

# <s> and </s> of the Mistral tokenizer (Mixtral's config.json).
MISTRAL_TOKENS = {"bos_token_id": 1, "eos_token_id": 2}

# Shapes from the models' published config.json files (meta-llama, mistralai on Hugging Face).
PRESETS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("llama3-tiny", 64, 2, 4, 2, 176, 256, 4096, tie_embeddings=False),
        ModelSpec("llama3.2-1b", 2048, 16, 32, 8, 8192, 128256, 131072, tie_embeddings=True,
                  rope_scaling=(32.0, 1.0, 4.0, 8192), **LLAMA3_TOKENS),
        ModelSpec("llama3.2-3b", 3072, 28, 24, 8, 8192, 128256, 131072, tie_embeddings=True,
                  rope_scaling=(32.0, 1.0, 4.0, 8192), **LLAMA3_TOKENS),
        ModelSpec("llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, **LLAMA3_TOKENS),
        ModelSpec("llama3.1-8b", 4096, 32, 32, 8, 14336, 128256, 131072, rope_scaling=(8.0, 1.0, 4.0, 8192),
                  **LLAMA3_TOKENS),
        ModelSpec("llama3.1-70b", 8192, 80, 64, 8, 28672, 128256, 131072, rope_scaling=(8.0, 1.0, 4.0, 8192),
                  **LLAMA3_TOKENS),
        ModelSpec("llama3.1-405b", 16384, 126, 128, 8, 53248, 128256, 131072, rope_scaling=(8.0, 1.0, 4.0, 8192),
                  **LLAMA3_TOKENS),
        # llama3-tiny's attention with 4 SwiGLU experts, 2 per token: the MoE model of tests and demos
        ModelSpec("mixtral-tiny", 64, 2, 4, 2, 96, 256, 4096, rope_theta=1_000_000.0, num_experts=4,
                  experts_per_token=2, router_aux_loss_coef=0.02, architecture="mixtral", **MISTRAL_TOKENS),
        ModelSpec("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, 32768, rope_theta=1_000_000.0, num_experts=8,
                  experts_per_token=2, router_aux_loss_coef=0.02, architecture="mixtral", **MISTRAL_TOKENS),
    )
}

HF_NAMES: dict[str, str] = {
    "meta-llama/Llama-3.2-1B": "llama3.2-1b",
    "meta-llama/Llama-3.2-3B": "llama3.2-3b",
    "meta-llama/Llama-3.1-8B": "llama3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama3.1-8b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "meta-llama/Llama-3.1-70B": "llama3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B": "llama3.1-70b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
}

MOE_MODEL_TYPES = frozenset({"mixtral", "deepseek_v2", "deepseek_v3", "qwen2_moe", "dbrx"})


def preset_for_hf_name(name: str) -> ModelSpec | None:
    """The preset with the shapes of a known Hub model (`meta-llama/Llama-3.1-8B[-Instruct]`)."""
    base = name.rstrip("/").removesuffix("-Instruct")
    key = HF_NAMES.get(base)
    return PRESETS[key] if key else None


# --- which kernel attends within documents (attention_kernel, docs/data.md) -----------------------
# A packed row whose records mark their documents (docs/data.md) is attended by one of:
# - `dense`: a boolean [B, 1, S, S] mask that PyTorch's SDPA applies: exact everywhere, S^2 bytes a
#   row (256 MiB at 16K tokens), and it computes the masked blocks too. The CPU path.
# - `flex`: FlexAttention with a block mask (torchtitan's way): only the blocks a document sees
#   are computed, in any precision. Compiled for CUDA; PyTorch has no FlexAttention backward on CPU.
# - `varlen`: flash attention over the documents as variable-length sequences
#   (`torch.nn.attention.varlen`, Megatron/TE's `cu_seqlens` way): half precision (bf16) on CUDA
#   only, as flash attention is.
# - `auto` (the default): `flex` on a GPU, `dense` on a CPU.
# Rows without documents are causal attention whatever this says (SDPA's flash kernel on GPUs).
ATTENTION_KERNELS = ("auto", "dense", "flex", "varlen")
DEFAULT_ATTENTION_KERNEL = "auto"

ATTENTION_KERNEL_DESCRIPTIONS = {
    "dense": "a dense [B, 1, S, S] mask through SDPA",
    "flex": "FlexAttention block masks",
    "varlen": "flash attention over variable-length documents",
}


def describe_attention_kernel(kernel: str) -> str:
    """The kernel a job asked for, in words (`validate` prints it)."""
    if kernel == "auto":
        return (f"attention_kernel auto: {ATTENTION_KERNEL_DESCRIPTIONS['flex']} on GPUs, "
                f"{ATTENTION_KERNEL_DESCRIPTIONS['dense']} on CPUs")
    return f"attention_kernel {kernel}: {ATTENTION_KERNEL_DESCRIPTIONS[kernel]}"


def resolve_attention_kernel(kernel: str, gpu: bool) -> str:
    """The kernel that runs: `auto` is FlexAttention on a GPU and the dense mask on a CPU."""
    if kernel == "auto":
        return "flex" if gpu else "dense"
    return kernel


def attention_kernel_problem(kernel: str, bf16: bool, gpu: bool | None) -> tuple[str, str] | None:
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
