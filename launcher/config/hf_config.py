"""Hugging Face `config.json` <-> ModelSpec, as transformers 4.x and 5.x write and read it.

transformers 4.x writes `rope_theta` and `rope_scaling` at the top level; 5.x writes one
`rope_parameters` dict (`rope_theta`, `rope_type` and the scaling keys) and still reads the 4.x
keys, which win where both are present. Absent keys take LlamaConfig's defaults (rope_theta
10000, rms_norm_eps 1e-6, max_position_embeddings 2048, bos 1, eos 2), because that is what
transformers builds from the same file. We export the 4.x form, which both versions read alike.

What the runtime's Llama does not implement (another architecture, biases, another activation,
another RoPE scaling) is recorded in `ModelSpec.unsupported`, by key, for the rules to refuse.
"""

from __future__ import annotations

from launcher.config.models import ModelSpec

LLAMA_DEFAULTS = {"rope_theta": 10_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048,
                  "bos_token_id": 1, "eos_token_id": 2}
# Weight files save_pretrained writes, in the order transformers prefers them.
WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                "pytorch_model.bin")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class ModelConfigError(ValueError):
    """A config.json that cannot describe a model (a required key missing or malformed)."""


def spec_from_hf_config(config: dict, name: str) -> ModelSpec:
    """A ModelSpec from a config.json dict (Llama; Mistral/Mixtral and others are sized for the
    planner and marked unsupported)."""
    try:
        heads = int(config["num_attention_heads"])
        rope_theta, rope_scaling, rope_unsupported = _rope(config)
        return ModelSpec(
            name=name,
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings")
                                        or LLAMA_DEFAULTS["max_position_embeddings"]),
            rope_theta=rope_theta,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=int(config.get("num_local_experts") or config.get("n_routed_experts") or 0),
            norm_eps=float(config.get("rms_norm_eps", LLAMA_DEFAULTS["rms_norm_eps"])),
            rope_scaling=rope_scaling,
            explicit_head_dim=_explicit_head_dim(config, heads),
            bos_token_id=_token(config, "bos_token_id"),
            eos_token_id=_token(config, "eos_token_id"),
            pad_token_id=_token(config, "pad_token_id"),
            unsupported=tuple(_unsupported(config) + rope_unsupported),
        )
    except KeyError as exc:
        raise ModelConfigError(f"{name}: config.json has no {exc.args[0]!r}, which a Llama config needs") from None
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"{name}: config.json has a malformed value ({exc})") from None


def _rope(config: dict) -> tuple[float, tuple[float, float, float, int] | None, list[str]]:
    params = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", params.get("rope_theta", LLAMA_DEFAULTS["rope_theta"]))
    scaling = config.get("rope_scaling") or params
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None, []
    if rope_type != "llama3":
        return float(theta), None, [f"rope_type: {rope_type}"]
    factor, low, high, original = (scaling[key] for key in LLAMA3_ROPE_KEYS)
    return float(theta), (float(factor), float(low), float(high), int(original)), []


def _explicit_head_dim(config: dict, heads: int) -> int | None:
    head_dim = config.get("head_dim")
    if head_dim is None or int(head_dim) == int(config["hidden_size"]) // heads:
        return None
    return int(head_dim)


def _token(config: dict, key: str) -> int | tuple[int, ...] | None:
    value = config.get(key, LLAMA_DEFAULTS.get(key))
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return None if value is None else int(value)


def _unsupported(config: dict) -> list[str]:
    found = []
    model_type = config.get("model_type", "llama")
    if model_type != "llama":
        found.append(f"model_type: {model_type}")
    if config.get("hidden_act", "silu") != "silu":
        found.append(f"hidden_act: {config['hidden_act']}")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            found.append(f"{key}: true")
    return found


def hf_config(spec: ModelSpec) -> dict:
    """The `config.json` of a spec (LlamaForCausalLM), in the form transformers 4.x and 5.x read alike."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": spec.norm_eps,
        "tie_word_embeddings": spec.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        **generation_config(spec),
    }
    if spec.rope_scaling:
        config["rope_scaling"] = {"rope_type": "llama3", **dict(zip(LLAMA3_ROPE_KEYS, spec.rope_scaling))}
    return config


def generation_config(spec: ModelSpec) -> dict:
    """The special-token ids of `generation_config.json` (what `generate()` starts and stops on)."""
    ids = {"bos_token_id": spec.bos_token_id, "eos_token_id": spec.eos_token_id,
           "pad_token_id": spec.pad_token_id}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in ids.items() if v is not None}
