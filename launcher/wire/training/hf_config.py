"""Hugging Face `config.json` <-> ModelSpec, as transformers 4.x and 5.x write and read it.

transformers 4.x writes `rope_theta` and `rope_scaling` at the top level; 5.x writes one
`rope_parameters` dict (`rope_theta`, `rope_type` and the scaling keys) and still reads the 4.x
keys, which win where both are present. Absent keys take LlamaConfig's defaults (rope_theta
10000, rms_norm_eps 1e-6, max_position_embeddings 2048, bos 1, eos 2), because that is what
transformers builds from the same file. We export the 4.x form, which both versions read alike.

Mixtral (`model_type: mixtral`) is the same model with a sparse MoE block in place of the MLP:
its keys (`num_local_experts`, `num_experts_per_tok`, `router_aux_loss_coef`) fill the spec's MoE
fields, and its absent keys take MixtralConfig's defaults (rope_theta 1e6, rms_norm_eps 1e-5, ...).

Mistral (`model_type: mistral`) is Llama's block with MistralConfig's defaults (rms_norm_eps 1e-6,
`sliding_window` 4096 when the key is absent, null for none); Mistral's and Mixtral's
`sliding_window` is kept as written and the runtime's attention applies it.

GPT-NeoX (`model_type: gpt_neox`) has keys of its own: `rotary_pct` and `rotary_emb_base` (4.x;
5.x writes them as `rope_parameters.partial_rotary_factor` and `rope_theta`, which win, as
GPTNeoXConfig reads them), `layer_norm_eps`, `use_parallel_residual`, `attention_bias`; absent
ones take GPTNeoXConfig's defaults (0.25, 10000, 1e-5, true, true; bos 0, eos 2).

What the runtime's model does not implement (another architecture, Llama biases, another
activation, another RoPE scaling, Mixtral's router jitter, dropout) is recorded in
`ModelSpec.unsupported`, by key, for the rules to refuse.
"""

from __future__ import annotations

import math

from launcher.wire.training.base import MAX_DIMENSION
from launcher.wire.training.models import GELU_ACTIVATIONS, ModelShapeError, ModelSpec

LLAMA_DEFAULTS = {"rope_theta": 10_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048,
                  "bos_token_id": 1, "eos_token_id": 2}
# transformers 5's MixtralConfig defaults (configuration_mixtral.py)
MIXTRAL_DEFAULTS = {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096 * 32,
                    "bos_token_id": 1, "eos_token_id": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
                    "router_aux_loss_coef": 0.001}
# transformers 5's MistralConfig defaults (configuration_mistral.py)
MISTRAL_DEFAULTS = {"rope_theta": 10_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096 * 32,
                    "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 4096}
# transformers 5's GPTNeoXConfig defaults (configuration_gpt_neox.py)
GPT_NEOX_DEFAULTS = {"rope_theta": 10_000.0, "partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5,
                     "max_position_embeddings": 2048, "bos_token_id": 0, "eos_token_id": 2,
                     "use_parallel_residual": True, "attention_bias": True, "hidden_act": "gelu"}
MODEL_DEFAULTS = {"llama": LLAMA_DEFAULTS, "mistral": MISTRAL_DEFAULTS, "mixtral": MIXTRAL_DEFAULTS,
                  "gpt_neox": GPT_NEOX_DEFAULTS}
# Weight files save_pretrained writes, in the order transformers prefers them.
WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                "pytorch_model.bin")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


# ModelSpec field -> the config.json key it is read from (to name the key a shape error is about)
CONFIG_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
               "num_kv_heads": "num_key_value_heads", "num_experts": "num_local_experts", "norm_eps": "rms_norm_eps",
               "experts_per_token": "num_experts_per_tok", "architecture": "model_type",
               "parallel_residual": "use_parallel_residual"}


class ModelConfigError(ValueError):
    """A config.json that cannot describe a model: `problem` names the key, `fix` says what to do."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(problem)


def spec_from_hf_config(config: dict, name: str) -> ModelSpec:
    """A ModelSpec from a config.json dict (Llama; Mistral/Mixtral and others are sized for the
    planner and marked unsupported). ModelConfigError names the key that is missing or malformed."""
    if not isinstance(config, dict):
        raise ModelConfigError(f"{name}: config.json holds a JSON {type(config).__name__}, not an object of "
                               "settings", "write it again with save_pretrained")
    model_type = config.get("model_type", "llama")
    defaults = MODEL_DEFAULTS.get(model_type, LLAMA_DEFAULTS)
    try:
        heads = _whole(config, "num_attention_heads")
        hidden = _whole(config, "hidden_size")
        rope_theta, rope_scaling, rope_unsupported = _rope(config, defaults)
        if model_type == "gpt_neox":
            return _gpt_neox_spec(config, name, heads, hidden, rope_scaling, rope_unsupported)
        return ModelSpec(
            name=name,
            hidden_size=hidden,
            num_layers=_whole(config, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=_whole(config, "num_key_value_heads", default=heads),
            intermediate_size=_whole(config, "intermediate_size"),
            vocab_size=_whole(config, "vocab_size"),
            max_position_embeddings=_whole(config, "max_position_embeddings",
                                           default=defaults["max_position_embeddings"]),
            rope_theta=rope_theta,
            tie_embeddings=_flag(config, "tie_word_embeddings"),
            num_experts=_whole(config, "num_local_experts", default=defaults.get("num_local_experts", 0), low=0)
            or _whole(config, "n_routed_experts", default=0, low=0),
            experts_per_token=_whole(config, "num_experts_per_tok", default=defaults.get("num_experts_per_tok", 2)),
            router_aux_loss_coef=_coefficient(config, "router_aux_loss_coef",
                                              defaults.get("router_aux_loss_coef", 0.001)),
            norm_eps=_number(config, "rms_norm_eps", defaults["rms_norm_eps"]),
            rope_scaling=rope_scaling,
            explicit_head_dim=_explicit_head_dim(config, hidden, heads),
            bos_token_id=_token(config, "bos_token_id", defaults),
            eos_token_id=_token(config, "eos_token_id", defaults),
            pad_token_id=_token(config, "pad_token_id", defaults),
            architecture=model_type if model_type in MODEL_DEFAULTS else "llama",
            sliding_window=_window(config, defaults),
            initializer_range=_number(config, "initializer_range", 0.02),
            unsupported=tuple(_unsupported(config) + rope_unsupported),
        )
    except ModelShapeError as exc:  # each key is sound, their combination is not
        key = CONFIG_KEYS.get(exc.field, exc.field)
        raise ModelConfigError(f"{name}: config.json: {exc.problem}", f"correct {key} in config.json") from None
    except ModelConfigError as exc:
        raise ModelConfigError(f"{name}: {exc.problem}", exc.fix) from None


def _gpt_neox_spec(config: dict, name: str, heads: int, hidden: int, rope_scaling, rope_unsupported: list[str]
                   ) -> ModelSpec:
    """GPTNeoXConfig's reading: the RoPE base from rope_parameters, else rotary_emb_base (a top-level
    rope_theta is not GPT-NeoX's key); the rotated fraction from rope_parameters, else rotary_pct;
    LayerNorm's epsilon; its biases and residual form."""
    defaults = GPT_NEOX_DEFAULTS
    params = _mapping(config, "rope_parameters")
    theta = _number(params, "rope_theta", _number(config, "rotary_emb_base", defaults["rope_theta"]),
                    "rope_parameters.")
    pct = _number(params, "partial_rotary_factor", _number(config, "rotary_pct", defaults["partial_rotary_factor"]),
                  "rope_parameters.")
    act = config.get("hidden_act", defaults["hidden_act"])
    if rope_scaling is not None:
        rope_unsupported = [*rope_unsupported, "rope_type: llama3"]
    return ModelSpec(
        name=name, hidden_size=hidden, num_layers=_whole(config, "num_hidden_layers"), num_heads=heads,
        num_kv_heads=heads, intermediate_size=_whole(config, "intermediate_size"),
        vocab_size=_whole(config, "vocab_size"),
        max_position_embeddings=_whole(config, "max_position_embeddings",
                                       default=defaults["max_position_embeddings"]),
        rope_theta=theta, rotary_pct=pct, tie_embeddings=_flag(config, "tie_word_embeddings"),
        norm_eps=_number(config, "layer_norm_eps", defaults["layer_norm_eps"]),
        bos_token_id=_token(config, "bos_token_id", defaults), eos_token_id=_token(config, "eos_token_id", defaults),
        pad_token_id=_token(config, "pad_token_id", defaults), architecture="gpt_neox",
        hidden_act=act if act in GELU_ACTIVATIONS else "gelu",
        parallel_residual=_flag(config, "use_parallel_residual", defaults["use_parallel_residual"]),
        attention_bias=_flag(config, "attention_bias", defaults["attention_bias"]),
        initializer_range=_number(config, "initializer_range", 0.02),
        unsupported=tuple(_unsupported(config) + rope_unsupported),
    )


def _window(config: dict, defaults: dict) -> int | None:
    """Mistral's and Mixtral's sliding_window as transformers reads it: absent takes the default
    (MistralConfig's 4096, MixtralConfig's none), null is none. Other models have none."""
    if "sliding_window" not in defaults and config.get("model_type") != "mixtral":
        return None
    if "sliding_window" not in config:
        return defaults.get("sliding_window")
    return _whole(config, "sliding_window", default=None)


def _missing(key: str) -> ModelConfigError:
    return ModelConfigError(f"config.json has no {key!r}, which a Llama config needs",
                            f"add {key} to config.json (save_pretrained writes it), or use a complete model")


def _malformed(key: str, value: object, expected: str) -> ModelConfigError:
    return ModelConfigError(f"config.json's {key} is {value!r}, not {expected}", f"correct {key} in config.json")


_REQUIRED = object()


def _whole(config: dict, key: str, default: object = _REQUIRED, low: int = 1, within: str = "") -> int:
    """A whole-number key (of the `within` object); absent or null takes `default`."""
    value = config.get(key)
    if value is None:
        if default is _REQUIRED:
            raise _missing(within + key)
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_DIMENSION:
        raise _malformed(within + key, value, f"a whole number from {low} to {MAX_DIMENSION}")
    return value


def _number(config: dict, key: str, default: float, within: str = "") -> float:
    """A positive finite number (of the `within` object); absent or null takes `default`."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise _malformed(within + key, value, "a finite number above 0")
    return float(value)


def _coefficient(config: dict, key: str, default: float) -> float:
    """A finite number of 0 or more; absent or null takes `default`."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise _malformed(key, value, "a finite number of 0 or more")
    return float(value)


def _flag(config: dict, key: str, default: bool = False) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _malformed(key, value, "true or false")
    return value


def _mapping(config: dict, key: str) -> dict:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed(key, value, "an object of settings")
    return value


def _rope(config: dict, defaults: dict) -> tuple[float, tuple[float, float, float, int] | None, list[str]]:
    params = _mapping(config, "rope_parameters")
    theta = _number(params, "rope_theta", defaults["rope_theta"], "rope_parameters.")
    theta = _number(config, "rope_theta", theta)  # the 4.x key wins
    within = "rope_scaling." if config.get("rope_scaling") else "rope_parameters."
    scaling = _mapping(config, "rope_scaling") or params
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return theta, None, []
    if rope_type != "llama3":
        return theta, None, [f"rope_type: {rope_type}"]
    missing = [key for key in LLAMA3_ROPE_KEYS if scaling.get(key) is None]
    if missing:
        raise _missing(within + missing[0])
    factor, low, high = (_number(scaling, key, 0.0, within) for key in LLAMA3_ROPE_KEYS[:3])
    return theta, (factor, low, high, _whole(scaling, "original_max_position_embeddings", within=within)), []


def _explicit_head_dim(config: dict, hidden: int, heads: int) -> int | None:
    head_dim = _whole(config, "head_dim", default=None)
    return None if head_dim is None or head_dim == hidden // heads else head_dim


def _token(config: dict, key: str, defaults: dict) -> int | tuple[int, ...] | None:
    value = config.get(key, defaults.get(key))
    if value is None:
        return None
    ids = value if isinstance(value, list) else [value]
    if not ids or any(isinstance(v, bool) or not isinstance(v, int) for v in ids):
        raise _malformed(key, value, "a token id or a list of them")
    return tuple(value) if isinstance(value, list) else value


def _unsupported(config: dict) -> list[str]:
    found = []
    model_type = config.get("model_type", "llama")
    if model_type not in MODEL_DEFAULTS:
        found.append(f"model_type: {model_type}")
    if config.get("router_jitter_noise"):  # random scaling of the router's input: no layout could reproduce it
        found.append(f"router_jitter_noise: {config['router_jitter_noise']}")
    for key in ("attention_dropout", "hidden_dropout"):  # the runtime has no dropout
        if config.get(key):
            found.append(f"{key}: {config[key]}")
    if model_type == "gpt_neox":
        if config.get("hidden_act", "gelu") not in GELU_ACTIVATIONS:
            found.append(f"hidden_act: {config['hidden_act']}")
        return found
    if model_type in ("llama", "mistral", "mixtral") and config.get("layer_types"):  # Ministral's mixed layers
        kinds = sorted(set(map(str, config["layer_types"])))
        if kinds != ["full_attention"] and kinds != ["sliding_attention"]:
            found.append(f"layer_types: {', '.join(kinds)}")
    if config.get("hidden_act", "silu") != "silu":
        found.append(f"hidden_act: {config['hidden_act']}")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            found.append(f"{key}: true")
    return found


ARCHITECTURE_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                        "mixtral": "MixtralForCausalLM", "gpt_neox": "GPTNeoXForCausalLM"}


def hf_config(spec: ModelSpec) -> dict:
    """The `config.json` of a spec (LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM for an
    MoE spec, GPTNeoXForCausalLM), in the form transformers 4.x and 5.x read alike."""
    if spec.is_gpt_neox:
        return _gpt_neox_config(spec)
    config = {
        "architectures": [ARCHITECTURE_CLASSES[spec.hf_model_type]],
        "model_type": spec.hf_model_type,
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
        "initializer_range": spec.initializer_range,
        "torch_dtype": "float32",
        **generation_config(spec),
    }
    if spec.rope_scaling:
        config["rope_scaling"] = {"rope_type": "llama3", **dict(zip(LLAMA3_ROPE_KEYS, spec.rope_scaling))}
    if spec.hf_model_type != "llama":  # MistralConfig and MixtralConfig have no bias keys, but a window
        del config["attention_bias"], config["mlp_bias"]
        config["sliding_window"] = spec.sliding_window
    if spec.is_moe:
        config.update(num_local_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                      router_aux_loss_coef=spec.router_aux_loss_coef, router_jitter_noise=0.0,
                      output_router_logits=False)
    return config


def _gpt_neox_config(spec: ModelSpec) -> dict:
    return {
        "architectures": [ARCHITECTURE_CLASSES["gpt_neox"]],
        "model_type": "gpt_neox",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rotary_pct": spec.rotary_pct,
        "rotary_emb_base": spec.rope_theta,
        "layer_norm_eps": spec.norm_eps,
        "use_parallel_residual": spec.parallel_residual,
        "attention_bias": spec.attention_bias,
        "hidden_act": spec.hidden_act,
        "tie_word_embeddings": spec.tie_embeddings,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "initializer_range": spec.initializer_range,
        "torch_dtype": "float32",
        **generation_config(spec),
    }


def generation_config(spec: ModelSpec) -> dict:
    """The special-token ids of `generation_config.json` (what `generate()` starts and stops on)."""
    ids = {"bos_token_id": spec.bos_token_id, "eos_token_id": spec.eos_token_id,
           "pad_token_id": spec.pad_token_id}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in ids.items() if v is not None}
