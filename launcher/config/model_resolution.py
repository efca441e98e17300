"""Which model a job trains, from its hyperparameters: the one decision the client's validation,
the planner and the container's runtime all take, so they agree.

In order: `model_preset`; the `config.json` of the pretrained source
(`hf_pretrained_model_name_or_dir`), which the caller reads (the client from a local directory,
channel or the Hub's cache, the container from what it downloaded); or the seed script's size
hyperparameters under `model_type: llama_v3 | llama_v2`. Size hyperparameters then adjust a
preset or a from-scratch model; next to pretrained weights they must agree with the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from launcher.config.hf_config import ModelConfigError, spec_from_hf_config
from launcher.config.hyperparameters import TrainingHyperparameters
from launcher.config.issues import Issue
from launcher.config.models import PRESETS, ModelShapeError, ModelSpec
from launcher.config.run_settings import DEFAULT_SEQ_LEN

HP = "hyperparameters"
# model_type -> RoPE base when `rotary_emb_base` is not given (Llama 3's 500000, Llama 2's 10000)
SEED_MODEL_TYPES = {"llama_v3": 500_000.0, "llama_v2": 10_000.0}
# the seed script's size hyperparameters -> ModelSpec fields
SIZE_KEYS = {
    "hidden_width": "hidden_size",
    "num_layers": "num_layers",
    "num_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "num_local_experts": "num_experts",
}
SEED_REQUIRED = ("hidden_width", "num_layers", "num_heads", "intermediate_size", "vocab_size")


@dataclass
class ModelResolution:
    spec: ModelSpec | None
    issues: list[Issue] = field(default_factory=list)


def sizes(hp: TrainingHyperparameters) -> dict[str, int]:
    """The size hyperparameters that are set, by ModelSpec field (AWS's `llama_intermediate_size`
    is the seed script's name for intermediate_size)."""
    out = {spec_key: getattr(hp, hp_key) for hp_key, spec_key in SIZE_KEYS.items() if getattr(hp, hp_key)}
    if hp.llama_intermediate_size and "intermediate_size" not in out:
        out["intermediate_size"] = hp.llama_intermediate_size
    return out


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
    elif hp.model_type in SEED_MODEL_TYPES and not hp.hf_pretrained_model_name_or_dir:
        spec, more = _seed_spec(hp)
        issues += more
    else:
        spec = None
    if spec is None:
        return ModelResolution(None, issues)
    given = sizes(hp)
    if pretrained and config is not None:
        issues += _disagreements(given, spec)
        return ModelResolution(spec, issues)
    try:
        return ModelResolution(replace(spec, **given) if given else spec, issues)
    except ModelShapeError as exc:
        return ModelResolution(None, issues + [_shape_issue(hp, exc)])


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
    return issues


def _seed_spec(hp: TrainingHyperparameters) -> tuple[ModelSpec | None, list[Issue]]:
    """The seed script's model: LlamaConfig from the size hyperparameters, max positions =
    max_context_width, untied embeddings, RMSNorm eps 1e-5 (as AWS's SMP example builds it)."""
    given = sizes(hp)
    missing = [key for key in SEED_REQUIRED if SIZE_KEYS[key] not in given]
    if missing:
        return None, [Issue(f"{HP}.model_type", hp.model_type,
                            f"builds a model from size hyperparameters, but {', '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not set",
                            f"set {', '.join(missing)}, or name the model with model_preset or "
                            "hf_pretrained_model_name_or_dir")]
    seq = hp.max_context_width or DEFAULT_SEQ_LEN
    try:
        spec = ModelSpec(
            name=f"{hp.model_type} ({given['num_layers']} layers x {given['hidden_size']})",
            hidden_size=given["hidden_size"], num_layers=given["num_layers"], num_heads=given["num_heads"],
            num_kv_heads=given.get("num_kv_heads", given["num_heads"]),
            intermediate_size=given["intermediate_size"], vocab_size=given["vocab_size"],
            max_position_embeddings=seq,
            rope_theta=float(hp.rotary_emb_base or SEED_MODEL_TYPES[hp.model_type]),
        )
    except ModelShapeError as exc:
        return None, [_shape_issue(hp, exc)]
    return spec, []


def _shape_issue(hp: TrainingHyperparameters, exc: ModelShapeError) -> Issue:
    """The size hyperparameters make no model (the planner and the runtime divide by them)."""
    key = {spec_key: hp_key for hp_key, spec_key in SIZE_KEYS.items()}.get(exc.field, exc.field)
    if exc.field == "num_kv_heads" and hp.num_key_value_heads is None:
        key = "num_heads"
    return Issue(f"{HP}.{key}", getattr(hp, key, None), exc.problem,
                 "use num_heads <= hidden_width and a num_key_value_heads that divides num_heads")


def _disagreements(given: dict[str, int], spec: ModelSpec) -> list[Issue]:
    keys = {spec_key: hp_key for hp_key, spec_key in SIZE_KEYS.items()}
    issues = []
    for spec_key, value in given.items():
        if getattr(spec, spec_key) != value:
            hp_key = keys.get(spec_key, spec_key)
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
    if hp.model_type and hp.model_type not in SEED_MODEL_TYPES:
        issues.append(Issue(f"{HP}.model_type", hp.model_type, "smlaunch's train.py builds Llama models only",
                            f"use one of {', '.join(SEED_MODEL_TYPES)}, or an entry point of your own"))
    if spec is None:
        if not deferred and not any(i.level == "error" for i in resolution.issues):
            issues.append(Issue(f"{HP}.model_preset", None, "smlaunch's train.py cannot tell which model to train",
                                "set model_preset (llama3-tiny, llama3.2-1b, llama3.1-8b, ...), "
                                "hf_pretrained_model_name_or_dir, or model_type: llama_v3 with hidden_width, "
                                "num_layers, num_heads, intermediate_size and vocab_size"))
        return issues
    for item in spec.unsupported:
        issues.append(Issue(field_name, hp.hf_pretrained_model_name_or_dir,
                            f"{spec.name}'s config.json has {item}, which smlaunch's Llama does not implement",
                            "pick a Llama-architecture model, or train it with an entry point of your own"))
    seq = hp.max_context_width
    if seq and seq > spec.max_position_embeddings:
        issues.append(Issue(f"{HP}.max_context_width", seq,
                            f"exceeds {spec.name}'s max_position_embeddings ({spec.max_position_embeddings}); "
                            "positions beyond it were never trained", f"use at most {spec.max_position_embeddings}",
                            "warning"))
    return issues
