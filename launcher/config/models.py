"""Llama-family model shapes known to the client: presets and Hugging Face names.

The container builds its models from the same specs; the planner sizes memory from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path


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
    # Llama 3.1 RoPE frequency scaling: (factor, low_freq_factor, high_freq_factor, original max positions)
    rope_scaling: tuple[float, float, float, int] | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# Shapes from the models' published config.json files (meta-llama on Hugging Face).
PRESETS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("llama3-tiny", 64, 2, 4, 2, 176, 256, 4096, tie_embeddings=False),
        ModelSpec("llama3.2-1b", 2048, 16, 32, 8, 8192, 128256, 131072, tie_embeddings=True,
                  rope_scaling=(32.0, 1.0, 4.0, 8192)),
        ModelSpec("llama3.2-3b", 3072, 28, 24, 8, 8192, 128256, 131072, tie_embeddings=True,
                  rope_scaling=(32.0, 1.0, 4.0, 8192)),
        ModelSpec("llama3.1-8b", 4096, 32, 32, 8, 14336, 128256, 131072, rope_scaling=(8.0, 1.0, 4.0, 8192)),
        ModelSpec("llama3.1-70b", 8192, 80, 64, 8, 28672, 128256, 131072, rope_scaling=(8.0, 1.0, 4.0, 8192)),
    )
}

HF_NAMES: dict[str, str] = {
    "meta-llama/Llama-3.2-1B": "llama3.2-1b",
    "meta-llama/Llama-3.2-3B": "llama3.2-3b",
    "meta-llama/Llama-3.1-8B": "llama3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama3.1-8b",
    "meta-llama/Meta-Llama-3-8B": "llama3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B": "llama3.1-70b",
}

MOE_MODEL_TYPES = frozenset({"mixtral", "deepseek_v2", "deepseek_v3", "qwen2_moe", "dbrx"})


def preset_for_hf_name(name: str) -> ModelSpec | None:
    base = name.rstrip("/").removesuffix("-Instruct")
    key = HF_NAMES.get(base)
    return PRESETS[key] if key else None


def spec_from_hf_config(config: dict, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face Llama/Mistral/Mixtral config.json dict."""
    heads = int(config["num_attention_heads"])
    return ModelSpec(
        name=name,
        hidden_size=int(config["hidden_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        rope_theta=float(config.get("rope_theta", 10_000.0)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        num_experts=int(config.get("num_local_experts") or config.get("n_routed_experts") or 0),
        norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        rope_scaling=_rope_scaling(config.get("rope_scaling")),
    )


def _rope_scaling(value: dict | None) -> tuple[float, float, float, int] | None:
    if not value or value.get("rope_type", value.get("type")) != "llama3":
        return None
    return (float(value["factor"]), float(value["low_freq_factor"]), float(value["high_freq_factor"]),
            int(value["original_max_position_embeddings"]))


def hf_config(spec: ModelSpec) -> dict:
    """The Hugging Face `config.json` of a spec (LlamaForCausalLM), for exported models."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta,
        "rms_norm_eps": spec.norm_eps,
        "tie_word_embeddings": spec.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "head_dim": spec.head_dim,
        "torch_dtype": "float32",
    }
    if spec.rope_scaling:
        factor, low, high, original = spec.rope_scaling
        config["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                  "high_freq_factor": high, "original_max_position_embeddings": original}
    return config


def resolve_model(
    *,
    preset: str | None = None,
    hf_name_or_dir: str | None = None,
    overrides: dict | None = None,
    base_dir: Path | None = None,
) -> ModelSpec | None:
    """The model a job trains, if the client can know it: a preset, a local HF directory with
    config.json, or a known HF name; then explicit shape overrides (num_heads, ...)."""
    spec = PRESETS.get(preset) if preset else None
    if spec is None and hf_name_or_dir:
        path = Path(hf_name_or_dir)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        config_file = path / "config.json"
        if config_file.is_file():
            spec = spec_from_hf_config(json.loads(config_file.read_text()), hf_name_or_dir)
        else:
            spec = preset_for_hf_name(hf_name_or_dir)
    if spec is None:
        return None
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    return replace(spec, **overrides) if overrides else spec
