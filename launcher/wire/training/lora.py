"""LoRA (low-rank adapters) as a job asks for it, under TRL's names so a TRL user's hyperparameters
carry over (`use_peft`, `lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules`,
`lora_modules_to_save`, `use_rslora`), QLoRA's `load_in_4bit` (an NF4 base) and HyperPod's
`merge_weights`: the hyperparameters, what they resolve to for a model (`LoraSettings`), the checks
client and runtime both run (`lora_issues`), and the trainable share validate prints. Torch-free; the
runtime's adapters are container.models.lora, its NF4 base container.models.qlora, docs/lora.md says
what is supported.

Module names are Hugging Face's, as peft takes them (`q_proj`, `query_key_value`, ...): a target is
a kind of linear layer, present in every block. `all-linear` means what it means to peft: every
linear layer but the output head.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pydantic import BaseModel, Field, FiniteFloat, field_validator

from launcher.wire.training.issues import Issue, did_you_mean
from launcher.wire.training.models import ModelSpec

HP = "hyperparameters"
ALL_LINEAR = "all-linear"
# each block's linear layers, by Hugging Face's module name: (inputs, outputs) of the spec
_LLAMA_KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GPT_NEOX_KINDS = ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")
# a mixture of experts' (Mixtral's) linear layers that take adapters: the attention projections. What peft
# also adapts there, the router and the experts (its target_parameters on transformers' stacked experts),
# smlaunch does not yet: refused by name, and so is all-linear, which means them too to peft
_MOE_KINDS = _LLAMA_KINDS[:4]
_MOE_NOT_ADAPTED = ("gate", "experts", "w1", "w2", "w3", "gate_up_proj")
# peft's targets when none are named (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
_PEFT_DEFAULTS = {"llama": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"), "gpt_neox": ("query_key_value",)}
# the modules outside the blocks that lora_modules_to_save may train whole
_SAVED_MODULES = {"llama": ("embed_tokens", "lm_head"), "gpt_neox": ("embed_in", "embed_out")}
# what smlaunch's runtime cannot yet do with adapters: refused by name rather than run without them
_NOT_YET = "smlaunch's LoRA does not compose with it yet (docs/lora.md)"
# QLoRA's NF4 base (torchao's NF4Tensor, as torchtune and bitsandbytes quantize it): one absmax scale
# per 64 weights, the scales themselves quantized to int8 in blocks of 256 (double quantization)
NF4_BLOCK, NF4_SCALER_BLOCK = 64, 256
QLORA_EXTRA = "pip install 'smlaunch[qlora]'"
# what torchao keeps of each NF4 weight tensor whole on every rank: its scales' mean (fp32) and the 16 levels (fp32)
NF4_TENSOR_BYTES = 4 + 16 * 4


def nf4_bytes(weights: float) -> float:
    """The bytes of `weights` NF4 weights (a tensor or its shard): 4 bits each, an int8 scale per 64 and
    an fp32 factor per 64 x 256 (the scales' blocks); NF4_TENSOR_BYTES more per tensor."""
    return weights / 2 + weights / NF4_BLOCK + 4 * weights / (NF4_BLOCK * NF4_SCALER_BLOCK)


class LoraHyperparameters(BaseModel):
    """TRL's (ModelConfig's) LoRA hyperparameters and HyperPod's merge_weights; unset ones are None."""

    use_peft: bool | None = Field(
        None, description="smlaunch: train low-rank adapters (LoRA) on a frozen base instead of the whole model "
                          "(TRL's name; docs/lora.md).")
    lora_r: int | None = Field(None, description="LoRA: the adapters' rank (default 16, TRL's).")
    lora_alpha: int | None = Field(None, description="LoRA: the adapters' scaling numerator, alpha/r (default 32).")
    lora_dropout: FiniteFloat | None = Field(
        None, description="LoRA: dropout on the adapters' input, from 0 to below 1 (default 0.05).")
    lora_target_modules: list[str] | str | None = Field(
        None, description="LoRA: the linear layers that get adapters, by Hugging Face's names (q_proj, v_proj, ...), "
                          "a list or comma-separated, or all-linear (every linear layer but the head); default "
                          "peft's for the model (Llama: q_proj,v_proj).")
    lora_modules_to_save: list[str] | str | None = Field(
        None, description="LoRA: modules outside the blocks trained whole and saved with the adapter "
                          "(embed_tokens, lm_head).")
    use_rslora: bool | None = Field(None, description="LoRA: rank-stabilised scaling alpha/sqrt(r) instead of alpha/r.")
    use_dora: bool | None = Field(None, description="DoRA: refused by smlaunch's train.py (not implemented).")
    load_in_4bit: bool | None = Field(
        None, description="QLoRA: the frozen base's linear layers (all but the head) held in NF4, block 64 "
                          "(torchao's NF4Tensor); with use_peft only (docs/lora.md).")
    merge_weights: bool | None = Field(
        None, description="LoRA: model.tar.gz also holds the merged model under merged/ (HyperPod's name).")

    @field_validator("lora_target_modules", "lora_modules_to_save", mode="before")
    @classmethod
    def _names(cls, value):
        """A list, or text as the wire and the toolkit carry one: comma-separated, JSON's or Python's list."""
        if isinstance(value, str) and value != ALL_LINEAR:
            return re.findall(r"[A-Za-z0-9_.\-]+", value)
        return value


@dataclass(frozen=True)
class LoraSettings:
    """What a LoRA job trains: rank, alpha, dropout, the target kinds (Hugging Face's names), the
    modules trained whole, rsLoRA's scaling, whether the merged model is exported."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    targets: tuple[str, ...] = ()
    modules_to_save: tuple[str, ...] = ()
    rslora: bool = False
    merge: bool = False
    nf4: bool = False  # QLoRA: the frozen base's linear layers in NF4 (load_in_4bit)

    @property
    def scaling(self) -> float:
        """peft's: alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.alpha / (math.sqrt(self.r) if self.rslora else self.r)


def _family(spec: ModelSpec) -> str:
    return "gpt_neox" if spec.is_gpt_neox else "llama"


def target_kinds(spec: ModelSpec) -> tuple[str, ...]:
    """The linear layers of a block that take adapters, by Hugging Face's name: on a dense model every
    one (what all-linear targets), on a mixture of experts the attention's."""
    return _GPT_NEOX_KINDS if spec.is_gpt_neox else _MOE_KINDS if spec.is_moe else _LLAMA_KINDS


def kind_shape(spec: ModelSpec, kind: str) -> tuple[int, int]:
    """(in features, out features) of a block's linear layer `kind`."""
    h, q, kv, ffn = (spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                     spec.intermediate_size)
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, ffn),
            "up_proj": (h, ffn), "down_proj": (ffn, h), "query_key_value": (h, 3 * h), "dense": (h, h),
            "dense_h_to_4h": (h, ffn), "dense_4h_to_h": (ffn, h)}[kind]


def lora_settings(hp, spec: ModelSpec) -> LoraSettings | None:
    """The adapters a job trains on `spec`, or None without use_peft (a checked job: lora_issues)."""
    if not hp.use_peft:
        return None
    asked = hp.lora_target_modules
    targets = target_kinds(spec) if asked == ALL_LINEAR else tuple(
        asked or _PEFT_DEFAULTS.get(spec.hf_model_type, _PEFT_DEFAULTS[_family(spec)]))
    default = LoraSettings()
    given = {"r": hp.lora_r, "alpha": hp.lora_alpha, "dropout": hp.lora_dropout}
    return LoraSettings(
        **{name: getattr(default, name) if value is None else value for name, value in given.items()},
        targets=tuple(k for k in target_kinds(spec) if k in targets),
        modules_to_save=tuple(hp.lora_modules_to_save or ()),
        rslora=bool(hp.use_rslora), merge=bool(hp.merge_weights), nf4=bool(hp.load_in_4bit))


def _asked(hp) -> list[str]:
    """The LoRA hyperparameters a job set (those that do nothing without use_peft)."""
    return [name for name in LoraHyperparameters.model_fields
            if name not in ("use_peft", "use_dora", "load_in_4bit") and getattr(hp, name) is not None]


def lora_issues(hp, params, degrees_path: str = "mp_parameters") -> list[Issue]:
    """What the runtime refuses of a job's LoRA before it builds anything, the model unknown: DoRA by
    name, QLoRA without adapters, values peft would refuse, the layouts and features adapters (and
    QLoRA's NF4 base) do not compose with yet (`params`: the job's ModelParallelParameters, named under
    `degrees_path`). A LoRA setting without use_peft is a warning."""
    issues = []
    if hp.use_dora:
        issues.append(Issue(f"{HP}.use_dora", hp.use_dora, "DoRA is not implemented by smlaunch's train.py",
                            "remove use_dora to train plain LoRA adapters (docs/lora.md)"))
    if not hp.use_peft:
        if hp.load_in_4bit:  # an NF4 model cannot train whole: refused, not trained in full precision
            issues.append(Issue(f"{HP}.load_in_4bit", hp.load_in_4bit, "QLoRA's NF4 base is frozen under LoRA's "
                                "adapters, so it needs use_peft", "set use_peft: 1 (QLoRA), or remove load_in_4bit "
                                "to train the whole model"))
        return issues + [Issue(f"{HP}.{name}", getattr(hp, name), "does nothing without use_peft: the whole model "
                               "trains", "set use_peft: 1 to train adapters, or remove it", level="warning")
                         for name in _asked(hp)]
    return (issues + _value_issues(hp) + _composition_issues(hp, params, degrees_path)
            + _dropout_issues(hp, params, degrees_path) + _nf4_issues(hp, params, degrees_path))


def _value_issues(hp) -> list[Issue]:
    """The values peft's LoraConfig refuses (r and alpha above 0, dropout in [0, 1))."""
    issues = []
    if hp.lora_r is not None and hp.lora_r <= 0:
        issues.append(Issue(f"{HP}.lora_r", hp.lora_r, "the adapters' rank must be a positive whole number "
                            "(peft refuses r <= 0)", "set lora_r: 8, 16 or 64, say"))
    if hp.lora_alpha is not None and hp.lora_alpha <= 0:
        issues.append(Issue(f"{HP}.lora_alpha", hp.lora_alpha, "alpha must be above 0 (the adapters' scaling is "
                            "alpha/r)", "set lora_alpha to a positive number, often twice lora_r"))
    if hp.lora_dropout is not None and not 0 <= hp.lora_dropout < 1:
        issues.append(Issue(f"{HP}.lora_dropout", hp.lora_dropout, "dropout is a probability from 0 to below 1",
                            "set lora_dropout: 0.05, or 0 for none"))
    if hp.lora_target_modules == []:
        issues.append(Issue(f"{HP}.lora_target_modules", [], "names no module, so no adapter would train",
                            f"name modules (q_proj,v_proj), write {ALL_LINEAR}, or remove it for peft's default"))
    return issues


def _composition_issues(hp, params, degrees_path: str) -> list[Issue]:
    """The parallelisms and features the runtime's adapters do not compose with yet, by name."""
    refused = [(f"{degrees_path}.{name}", value) for name, value in (
        ("pipeline_parallel_degree", params.pipeline_degree),
        ("expert_parallel_degree", params.expert_parallel_degree)) if value > 1]
    refused += [(f"{HP}.fp8", hp.fp8)] if hp.fp8 else []
    return [Issue(name, value, f"with use_peft: {_NOT_YET}", "remove it, or train the whole model without "
                  "use_peft") for name, value in refused]


def _dropout_issues(hp, params, degrees_path: str) -> list[Issue]:
    """Dropout where its masks would not be one eager model's, not yet: under tensor parallelism the ranks
    share each adapter's input and each would draw its own mask for it (DTensor draws from the rank's
    generator on CPU); compiled, inductor draws a block's masks from its own generator (a compiled run's
    losses differed from the eager run's at dropout 0.3 on llama3-tiny), and a recomputation inside the
    graph redrawing the forward's masks is not established."""
    dropout = LoraSettings().dropout if hp.lora_dropout is None else hp.lora_dropout
    tp = params.tensor_parallel_degree
    why = ([f"{degrees_path}.tensor_parallel_degree {tp} yet: each tensor-parallel rank would draw its own dropout "
            "masks for the input the ranks share"] if tp > 1 else [])
    why += [f"{HP}.compile yet: inductor draws a compiled block's dropout masks from its own generator, not "
            "eager torch's"] if hp.compile else []
    if dropout == 0 or not why:
        return []
    default = f" ({dropout} is the default)" if hp.lora_dropout is None else ""
    return [Issue(f"{HP}.lora_dropout", dropout, f"dropout{default} does not compose with {', nor with '.join(why)}",
                  "set lora_dropout: 0")]


def _nf4_issues(hp, params, degrees_path: str) -> list[Issue]:
    """What QLoRA's NF4 base does not compose with yet: tensor parallelism (it does not split torchao's
    NF4 weights), a delayed init (the base is loaded and quantized whole on each rank before it is sharded)."""
    if not hp.load_in_4bit:
        return []
    issues, fix = [], "or load_in_4bit to train LoRA on the base in its own dtype"
    if params.tensor_parallel_degree > 1:
        issues.append(Issue(f"{degrees_path}.tensor_parallel_degree", params.tensor_parallel_degree, "with "
                            "load_in_4bit (QLoRA) not yet: tensor parallelism does not split the NF4 base",
                            f"remove tensor_parallel_degree (FSDP shards the NF4 base), {fix}"))
    delayed = hp.delayed_param or params.delayed_parameter_initialization
    if delayed:
        issues.append(Issue(f"{HP}.delayed_param", delayed, "with load_in_4bit (QLoRA) not yet: the NF4 base is "
                            "loaded and quantized on every rank before it is sharded",
                            f"remove delayed_param (and delayed_parameter_initialization), {fix}"))
    return issues


def model_lora_issues(hp, spec: ModelSpec, shards: int = 1) -> list[Issue]:
    """The targets and saved modules against the model's own (Hugging Face's names), what a mixture of
    experts' adapters do not cover yet (its router and experts), and QLoRA's layers against NF4's blocks in each of
    `shards` FSDP shards (the sharding group)."""
    if not hp.use_peft:
        return []
    kinds, saved = target_kinds(spec), _SAVED_MODULES[_family(spec)]
    asked = hp.lora_target_modules
    issues = _moe_issues(hp, spec)
    for name in (asked if isinstance(asked, list) else []):
        if spec.is_moe and name in _MOE_NOT_ADAPTED:
            continue  # _moe_issues says it
        if name in saved:
            issues.append(Issue(f"{HP}.lora_target_modules", name, "LoRA on the embedding or the head is not yet "
                                "implemented by smlaunch's train.py", f"train it whole: lora_modules_to_save: {name}"))
        elif name not in kinds:
            issues.append(Issue(f"{HP}.lora_target_modules", name, f"{spec.name} has no linear layer of this name",
                                did_you_mean(name, kinds) or f"name some of {', '.join(kinds)}, or {ALL_LINEAR}"))
    issues += _nf4_shape_issues(hp, spec, shards)
    for name in hp.lora_modules_to_save or []:
        if name not in saved:
            issues.append(Issue(f"{HP}.lora_modules_to_save", name, "not a module smlaunch trains whole beside "
                                "adapters", did_you_mean(name, saved)))
        elif spec.tie_embeddings:
            issues.append(Issue(f"{HP}.lora_modules_to_save", name, f"{spec.name} ties its embedding and head: "
                                f"{_NOT_YET}", "remove lora_modules_to_save"))
    return issues


def _moe_issues(hp, spec: ModelSpec) -> list[Issue]:
    """On a mixture of experts, adapters go on the attention only: the router and the experts (which
    all-linear means to peft) are refused by name, and so is QLoRA's NF4 base (the experts are stacked
    parameters, not the linear layers it quantizes)."""
    if not spec.is_moe:
        return []
    attention = ",".join(_MOE_KINDS)
    asked = hp.lora_target_modules
    named = [asked] if asked == ALL_LINEAR else [n for n in asked or [] if n in _MOE_NOT_ADAPTED]
    issues = [Issue(f"{HP}.lora_target_modules", name, f"{spec.name} is a mixture of experts: smlaunch's adapters "
                    "go on its attention only, not yet on the router (gate) or the experts, which are stacked "
                    "parameters" + (" (all-linear means them too to peft)" if name == ALL_LINEAR else ""),
                    f"name attention projections: {attention}") for name in named]
    if hp.load_in_4bit:
        issues.append(Issue(f"{HP}.load_in_4bit", hp.load_in_4bit, f"{spec.name} is a mixture of experts: {_NOT_YET} "
                            "(its experts are stacked parameters, not the linear layers QLoRA quantizes)",
                            "remove load_in_4bit to train LoRA on the base in its own dtype"))
    return issues


def _nf4_shape_issues(hp, spec: ModelSpec, shards: int) -> list[Issue]:
    """torchao's NF4 quantizes a weight whole blocks of scales at a time, and FSDP cuts it by rows:
    each linear layer's weights a multiple of 64 x 256 (the blocks of weights and of scales) in each
    of `shards` shards, its rows a multiple of `shards`."""
    unit = NF4_BLOCK * NF4_SCALER_BLOCK
    shapes = {kind: kind_shape(spec, kind)[::-1] for kind in target_kinds(spec)}  # (out, in): the weight's
    odd = [f"{kind} {rows}x{columns}" for kind, (rows, columns) in shapes.items()
           if (rows * columns) % (unit * shards) or rows % shards] if hp.load_in_4bit and not spec.is_moe else []
    if not odd:
        return []
    cut = f" cut into {shards} FSDP shards" if shards > 1 else ""
    return [Issue(f"{HP}.load_in_4bit", hp.load_in_4bit, f"{spec.name}'s {', '.join(odd)} weights{cut} are not "
                  f"whole blocks of {unit} ({NF4_BLOCK}-weight blocks in {NF4_SCALER_BLOCK}-scale blocks), which "
                  "torchao's NF4 quantizes whole", ("shard over fewer ranks (hybrid_shard_degree), or " if cut else "")
                  + "remove load_in_4bit to train LoRA on the base in its own dtype")]


def trainable_parameters(spec: ModelSpec, lora: LoraSettings) -> tuple[int, int]:
    """(trainable, all) parameters as peft's print_trainable_parameters counts them: the adapters and the
    modules trained whole are trainable, and all counts the base, the adapters and those modules'
    trained copies (peft keeps the original beside each)."""
    adapters = spec.num_layers * sum(lora.r * sum(kind_shape(spec, kind)) for kind in lora.targets)
    whole = len(lora.modules_to_save) * spec.vocab_size * spec.hidden_size
    return adapters + whole, spec.parameter_count() + adapters + whole


def describe(spec: ModelSpec, lora: LoraSettings) -> str:
    """"LoRA r 16, alpha 32 on 7 module kinds x 32 layers: 42.0M trainable of 8.07B, 0.52%"."""
    trainable, total = trainable_parameters(spec, lora)
    rslora = " (rsLoRA)" if lora.rslora else ""
    saved = f" + {', '.join(lora.modules_to_save)} whole" if lora.modules_to_save else ""
    base = f"; base NF4, block {NF4_BLOCK} (scales int8, block {NF4_SCALER_BLOCK})" if lora.nf4 else ""
    return (f"LoRA r {lora.r}, alpha {lora.alpha}{rslora} on {len(lora.targets)} module kinds x {spec.num_layers} "
            f"layers{saved}: {_count(trainable)} trainable of {_count(total)}, {100 * trainable / total:.2f}%{base}")


def _count(n: int) -> str:
    """Three significant digits: 41943040 -> 42.0M, 8072204288 -> 8.07B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.{max(0, 2 - int(math.log10(value)))}f}{unit}"
    return str(n)
