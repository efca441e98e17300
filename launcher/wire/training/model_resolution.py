"""Which model a job trains, from its hyperparameters: the one decision the client's validation,
the planner and the container's runtime all take, so they agree.

In order: `model_preset`; the `config.json` of the pretrained source
(`hf_pretrained_model_name_or_dir`), which the caller reads (the client from a local directory,
channel or the Hub's cache, the container from what it downloaded); or AWS's SMP v2 script's
size hyperparameters under its `model_type` (MODEL_TYPES). Size hyperparameters then adjust a
preset or a from-scratch model; next to pretrained weights they must agree with the config.

Each model_type builds what AWS's script builds (its `train_utils.get_model_config`): the
transformers config of that family from the same hyperparameters, with that family's fixed
values (MODEL_TYPES). Where smlaunch differs it is said there: an explicit `rotary_emb_base`
is honoured by every model_type (AWS's script fixes Mistral's and Mixtral's), `llama_v3` defaults
to Llama 3's RoPE base 500000 (AWS's script: 10000), and the intermediate size is required
where AWS's script has a default. A hyperparameter that the chosen model does not have (a
sliding window for Llama, experts per token for a dense model, rotary_pct outside GPT-NeoX) is
an error naming it: AWS's script would ignore it silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from launcher.wire.training.hf_config import ModelConfigError, spec_from_hf_config
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.issues import Issue
from launcher.wire.training.models import LLAMA_ROPE_SCALING_DEFAULTS, PRESETS, ModelShapeError, ModelSpec
from launcher.wire.training.run_settings import DEFAULT_SEQ_LEN

HP = "hyperparameters"


@dataclass(frozen=True)
class ModelType:
    """One `model_type` of AWS's script: the transformers config it builds and that config's values
    the script fixes (train_utils.get_model_config)."""

    config: str  # the transformers config class
    architecture: str  # ModelSpec.architecture
    rope_theta: float  # without rotary_emb_base
    norm_eps: float
    tokens: tuple[int | None, int | None] = (None, None)  # bos, eos
    required: tuple[str, ...] = ("hidden_width", "num_layers", "num_heads", "intermediate_size", "vocab_size")


MODEL_TYPES = {
    "llama_v3": ModelType("LlamaConfig", "llama", 500_000.0, 1e-5),
    "llama_v2": ModelType("LlamaConfig", "llama", 10_000.0, 1e-5),
    "mistral": ModelType("MistralConfig", "mistral", 10_000.0, 1e-6, (1, 2)),
    "mixtral": ModelType("MixtralConfig", "mixtral", 1_000_000.0, 1e-5, (1, 2)),
    # GPTNeoXConfig: intermediate_size 4 x hidden_width, rotary_pct 0.25, LayerNorm eps 1e-5, GELU,
    # parallel residual, biased attention, untied; its bos/eos defaults 0 and 2
    "gpt_neox": ModelType("GPTNeoXConfig", "gpt_neox", 10_000.0, 1e-5, (0, 2),
                          ("hidden_width", "num_layers", "num_heads", "vocab_size")),
}
# AWS's script's defaults where smlaunch takes them: Mixtral's experts (MixtralConfig's too) and
# its auxiliary-loss weight (MixtralConfig's; AWS's script writes it and, with output_router_logits
# off, never adds the loss: router_aux_loss_coef 0 is that), GPT-NeoX's rotated fraction.
MIXTRAL_EXPERTS, MIXTRAL_EXPERTS_PER_TOKEN, MIXTRAL_AUX_LOSS_COEF = 8, 2, 0.001
GPT_NEOX_ROTARY_PCT = 0.25
# hyperparameter -> ModelSpec field: what resizes or reshapes a preset or a from-scratch model, and
# must agree with a pretrained model's config.json
SIZE_KEYS = {
    "hidden_width": "hidden_size",
    "num_layers": "num_layers",
    "num_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
    "rotary_emb_base": "rope_theta",
    "rotary_pct": "rotary_pct",
    "sliding_window": "sliding_window",
}
# training settings of the model, which a pretrained model takes from the job too
TRAINING_KEYS = {"router_aux_loss_coef": "router_aux_loss_coef", "initializer_range": "initializer_range"}
ROPE_SCALING_KEYS = ("rope_scaling_factor", "rope_scaling_low_freq_factor", "rope_scaling_high_freq_factor",
                     "rope_scaling_original_max_position_embeddings")
MOE_KEYS = ("num_experts_per_tok", "router_aux_loss_coef", "moe_load_balancing")
_HP_KEY = {spec_key: hp_key for hp_key, spec_key in {**SIZE_KEYS, **TRAINING_KEYS}.items()} | {
    "rope_scaling": "rope_scaling_type", "architecture": "model_type"}
_FIXES = {
    "num_kv_heads": "use a num_key_value_heads that divides num_heads (GPT-NeoX: leave it out)",
    "num_heads": "use num_heads <= hidden_width, dividing it",
    "experts_per_token": "use a num_experts_per_tok from 1 to num_local_experts",
    "num_experts": "set num_local_experts for model_type mixtral only",
    "sliding_window": "remove sliding_window, or use model_type mistral or mixtral",
    "rotary_pct": "remove rotary_pct (GPT-NeoX's), or use one that rotates an even number of head dimensions",
    "rope_scaling": "remove the rope_scaling_* hyperparameters (Llama's RoPE scaling)",
    "architecture": "remove the GPT-NeoX hyperparameters, or use model_type gpt_neox",
}


@dataclass
class ModelResolution:
    spec: ModelSpec | None
    issues: list[Issue] = field(default_factory=list)


def sizes(hp: TrainingHyperparameters) -> dict:
    """The model hyperparameters that are set, by ModelSpec field (AWS's `llama_intermediate_size`
    is the Llama name for intermediate_size; rope_scaling_type and its factors make rope_scaling)."""
    out = {spec_key: getattr(hp, hp_key) for hp_key, spec_key in {**SIZE_KEYS, **TRAINING_KEYS}.items()
           if getattr(hp, hp_key) is not None}
    if hp.llama_intermediate_size and "intermediate_size" not in out:
        out["intermediate_size"] = hp.llama_intermediate_size
    if "rope_theta" in out:
        out["rope_theta"] = float(out["rope_theta"])
    if hp.rope_scaling_type is not None:
        out["rope_scaling"] = _rope_scaling(hp)
    if hp.moe_load_balancing == "none" and hp.router_aux_loss_coef is None:
        out["router_aux_loss_coef"] = 0.0
    return out


def _rope_scaling(hp: TrainingHyperparameters) -> tuple[float, float, float, int] | None:
    """AWS's rope_scaling_type llama3 with its factors (defaults: AWS's script's, Llama 3.1's)."""
    if hp.rope_scaling_type != "llama3":
        return None
    return tuple(getattr(hp, key) if getattr(hp, key) is not None else default
                 for key, default in zip(ROPE_SCALING_KEYS, LLAMA_ROPE_SCALING_DEFAULTS))


def resolve_model(hp: TrainingHyperparameters, config: dict | None = None,
                  config_name: str | None = None) -> ModelResolution:
    """The job's model. `config`: the pretrained source's config.json, when it could be read."""
    pretrained = bool(hp.hf_pretrained_model_name_or_dir) and not hp.init_from_scratch
    issues = _conflicts(hp)
    if hp.model_preset:
        spec = PRESETS.get(hp.model_preset)  # an unknown preset is reported by the hyperparameter rules
    elif config is not None:
        try:
            spec = spec_from_hf_config(config, config_name or hp.hf_pretrained_model_name_or_dir or "config.json")
        except ModelConfigError as exc:
            issues.append(Issue(f"{HP}.hf_pretrained_model_name_or_dir", hp.hf_pretrained_model_name_or_dir,
                                exc.problem, exc.fix))
            return ModelResolution(None, issues)
    elif hp.model_type in MODEL_TYPES and not hp.hf_pretrained_model_name_or_dir:
        spec, more = _seed_spec(hp)
        issues += more
    else:
        spec = None
    if spec is None:
        return ModelResolution(None, issues)
    issues += _model_type_issues(hp, spec)
    given = sizes(hp)
    if pretrained and config is not None:
        issues += _disagreements({k: v for k, v in given.items() if k not in TRAINING_KEYS.values()}, spec)
        given = {k: v for k, v in given.items() if k in TRAINING_KEYS.values()}
    try:
        spec = replace(spec, **given) if given else spec
    except ModelShapeError as exc:
        return ModelResolution(None, issues + [_shape_issue(hp, exc)])
    return ModelResolution(spec, issues + _moe_issues(hp, spec))


def _conflicts(hp: TrainingHyperparameters) -> list[Issue]:
    issues = []
    if hp.model_preset and hp.hf_pretrained_model_name_or_dir:
        issues.append(Issue(f"{HP}.model_preset", hp.model_preset,
                            "and hf_pretrained_model_name_or_dir both name the model",
                            "keep hf_pretrained_model_name_or_dir (its config.json defines the model) "
                            "and remove model_preset"))
    if hp.init_from_scratch and not hp.hf_pretrained_model_name_or_dir:
        issues.append(Issue(f"{HP}.init_from_scratch", True,
                            "only means something next to hf_pretrained_model_name_or_dir "
                            "(a preset or size hyperparameters always start from scratch)",
                            "remove it"))
    if hp.llama_intermediate_size and hp.intermediate_size and hp.llama_intermediate_size != hp.intermediate_size:
        issues.append(Issue(f"{HP}.llama_intermediate_size", hp.llama_intermediate_size,
                            f"differs from intermediate_size = {hp.intermediate_size}", "set only one of them"))
    for key in ROPE_SCALING_KEYS:
        if getattr(hp, key) is not None and hp.rope_scaling_type != "llama3":
            issues.append(Issue(f"{HP}.{key}", getattr(hp, key), "scales RoPE only with rope_scaling_type: llama3",
                                "set rope_scaling_type: llama3, or remove it"))
    if hp.moe_load_balancing == "none" and hp.router_aux_loss_coef:
        issues.append(Issue(f"{HP}.router_aux_loss_coef", hp.router_aux_loss_coef,
                            "weighs a load-balancing loss that moe_load_balancing: none leaves out",
                            "remove one of them (aux_loss adds the loss with this weight)"))
    return issues


def _seed_spec(hp: TrainingHyperparameters) -> tuple[ModelSpec | None, list[Issue]]:
    """AWS's script's model of `model_type` from the size hyperparameters: max positions =
    max_context_width, untied embeddings, its model type's fixed values (MODEL_TYPES)."""
    kind = MODEL_TYPES[hp.model_type]
    given = sizes(hp)
    missing = [key for key in kind.required if SIZE_KEYS[key] not in given]
    if missing:
        return None, [Issue(f"{HP}.model_type", hp.model_type,
                            f"builds a model from size hyperparameters, but {', '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not set",
                            f"set {', '.join(missing)}, or name the model with model_preset or "
                            "hf_pretrained_model_name_or_dir")]
    hidden, heads = given["hidden_size"], given["num_heads"]
    family: dict = {"architecture": kind.architecture, "bos_token_id": kind.tokens[0], "eos_token_id": kind.tokens[1]}
    if kind.architecture == "mixtral":
        family.update(num_experts=MIXTRAL_EXPERTS, experts_per_token=MIXTRAL_EXPERTS_PER_TOKEN,
                      router_aux_loss_coef=MIXTRAL_AUX_LOSS_COEF)
    if kind.architecture == "gpt_neox":
        family.update(rotary_pct=GPT_NEOX_ROTARY_PCT, hidden_act="gelu", parallel_residual=True, attention_bias=True)
    try:
        spec = ModelSpec(
            name=f"{hp.model_type} ({given['num_layers']} layers x {hidden})",
            hidden_size=hidden, num_layers=given["num_layers"], num_heads=heads,
            num_kv_heads=heads, intermediate_size=given.get("intermediate_size", 4 * hidden),
            vocab_size=given["vocab_size"], max_position_embeddings=hp.max_context_width or DEFAULT_SEQ_LEN,
            rope_theta=kind.rope_theta, norm_eps=kind.norm_eps, **family)
    except ModelShapeError as exc:
        return None, [_shape_issue(hp, exc)]
    return spec, []


def _model_type_issues(hp: TrainingHyperparameters, spec: ModelSpec) -> list[Issue]:
    """model_type next to a preset or config.json must name the model they hold."""
    kind = MODEL_TYPES.get(hp.model_type or "")
    if kind is None or not (hp.model_preset or hp.hf_pretrained_model_name_or_dir):
        return []
    if kind.architecture == spec.architecture or (kind.architecture == "mixtral" and spec.is_moe):
        return []
    source = "model_preset" if hp.model_preset else "hf_pretrained_model_name_or_dir"
    return [Issue(f"{HP}.model_type", hp.model_type,
                  f"builds a {kind.config} model, but {source} names a {spec.hf_model_type} model ({spec.name})",
                  f"remove model_type (the {source.split('_')[0]} defines the model), or name a {kind.architecture} "
                  "model")]


def _moe_issues(hp: TrainingHyperparameters, spec: ModelSpec) -> list[Issue]:
    if spec.is_moe:
        return []
    return [Issue(f"{HP}.{key}", getattr(hp, key), f"applies to a mixture of experts, and {spec.name} is dense",
                  "remove it, or train a Mixtral (model_type: mixtral with num_local_experts)")
            for key in MOE_KEYS if getattr(hp, key) is not None]


def _shape_issue(hp: TrainingHyperparameters, exc: ModelShapeError) -> Issue:
    """The model hyperparameters make no model (the planner and the runtime divide by them)."""
    key = _HP_KEY.get(exc.field, exc.field)
    if exc.field == "num_kv_heads" and hp.num_key_value_heads is None:
        key = "num_heads"
    if key == "intermediate_size" and hp.intermediate_size is None and hp.llama_intermediate_size is not None:
        key = "llama_intermediate_size"
    return Issue(f"{HP}.{key}", getattr(hp, key, None), exc.problem,
                 _FIXES.get(exc.field, f"correct {key}"))


def _disagreements(given: dict, spec: ModelSpec) -> list[Issue]:
    issues = []
    for spec_key, value in given.items():
        if getattr(spec, spec_key) != value:
            hp_key = _HP_KEY.get(spec_key, spec_key)
            issues.append(Issue(f"{HP}.{hp_key}", value,
                                f"differs from the pretrained model's config.json ({spec.name}: "
                                f"{getattr(spec, spec_key)})",
                                "remove it (the pretrained weights fix the shape), or set "
                                "init_from_scratch: 1 to train a resized model from random weights"))
    return issues


def trainable_issues(hp: TrainingHyperparameters, resolution: ModelResolution, deferred: bool = False) -> list[Issue]:
    """What smlaunch's train.py needs of the resolved model. `deferred`: the pretrained source
    is read only where the job runs (an S3 channel), so an unknown model is no error yet."""
    spec, field_name = resolution.spec, f"{HP}.hf_pretrained_model_name_or_dir"
    issues = []
    if hp.model_type and hp.model_type not in MODEL_TYPES:
        issues.append(Issue(f"{HP}.model_type", hp.model_type,
                            "is not a model_type smlaunch's train.py builds",
                            f"use one of {', '.join(MODEL_TYPES)}, or an entry point of your own"))
    if spec is None:
        if not deferred and not any(i.level == "error" for i in resolution.issues):
            issues.append(Issue(f"{HP}.model_preset", None, "smlaunch's train.py cannot tell which model to train",
                                "set model_preset (llama3-tiny, llama3.2-1b, llama3.1-8b, ...), "
                                "hf_pretrained_model_name_or_dir, or model_type (llama_v3, mistral, mixtral, "
                                "gpt_neox, ...) with hidden_width, num_layers, num_heads, intermediate_size and "
                                "vocab_size"))
        return issues
    for item in spec.unsupported:
        issues.append(Issue(field_name, hp.hf_pretrained_model_name_or_dir,
                            f"{spec.name}'s config.json has {item}, which smlaunch's runtime does not implement",
                            "pick a Llama, Mistral, Mixtral or GPT-NeoX model, or train it with an entry point "
                            "of your own"))
    seq = hp.max_context_width
    if seq and seq > spec.max_position_embeddings:
        issues.append(Issue(f"{HP}.max_context_width", seq,
                            f"exceeds {spec.name}'s max_position_embeddings ({spec.max_position_embeddings}); "
                            "positions beyond it were never trained", f"use at most {spec.max_position_embeddings}",
                            "warning"))
    return issues
