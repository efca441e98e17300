"""Hugging Face Llama, Mistral, Mixtral and GPT-NeoX checkpoints: parameter names, loading
weights, exporting the trained model.

Our module names follow torchtitan; `LlamaForCausalLM` uses its own. RoPE in
`container.models.llama` already uses Hugging Face's rotate-half layout, so q/k weights map
one to one without the permutation that Meta's original checkpoints need. Mixtral's files (the
Hub's names, which transformers 5 reads and writes although it fuses experts in memory) hold
each expert's w1/w2/w3 as its own tensor; our MoE stacks them on dim 0, so one of our names
stands for E Hub tensors.

Both entry points take a plain module or an FSDP2-sharded one. Under a process group export is a
collective, and so is loading with `distributed=True`: every rank calls them, rank 0 alone
touches the files.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from launcher.wire.training.hf_config import WEIGHT_FILES, generation_config, hf_config
from launcher.wire.training.models import ModelSpec

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# save_pretrained's long-standing default; keeps each file small enough for S3 single-part tools.
MAX_SHARD_BYTES = 5 * 1024**3
# the parameters with a row per vocabulary entry (padded for tensor parallelism where it cannot split them)
VOCAB_ROWS = ("tok_embeddings.weight", "output.weight")


@dataclass(frozen=True)
class Names:
    """One family's parameter names: ours (torchtitan's) -> Hugging Face's checkpoint names."""

    top: dict[str, str]  # whole names outside the blocks
    layer: dict[str, str]  # a block's modules, without the parameter's own name
    layers: str  # the blocks' prefix in Hugging Face's checkpoint
    ignored: tuple[str, ...]  # checkpoint tensors that are no parameters (buffers older versions saved)

    def to_hf(self, name: str) -> str | None:
        if name in self.top:
            return self.top[name]
        match = _OUR_LAYER.fullmatch(name)
        if match is None:
            return None
        module, _, param = match.group(2).rpartition(".")
        return f"{self.layers}.{match.group(1)}.{self.layer[module]}.{param}" if module in self.layer else None

    def from_hf(self, name: str) -> str | None:
        for ours, hf in self.top.items():
            if hf == name:
                return ours
        layer, dot, rest = name.removeprefix(self.layers + ".").partition(".")
        if not name.startswith(self.layers + ".") or not dot or not layer.isdigit():
            return None
        module, _, param = rest.rpartition(".")
        ours = {hf: ours for ours, hf in self.layer.items()}.get(module)
        return f"layers.{layer}.{ours}.{param}" if ours else None

    def is_ignored(self, name: str) -> bool:
        return name.endswith(self.ignored)


LLAMA_NAMES = Names(
    top={"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
         "output.weight": "lm_head.weight"},
    layer={"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
           "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
           "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm",
           "ffn_norm": "post_attention_layernorm", "moe.gate": "block_sparse_moe.gate"},
    layers="model.layers",
    ignored=("rotary_emb.inv_freq",),  # RoPE's buffer in older Llama checkpoints; recomputed
)
GPT_NEOX_NAMES = Names(
    top={"tok_embeddings.weight": "gpt_neox.embed_in.weight", "norm.weight": "gpt_neox.final_layer_norm.weight",
         "norm.bias": "gpt_neox.final_layer_norm.bias", "output.weight": "embed_out.weight"},
    layer={"attention.wqkv": "attention.query_key_value", "attention.wo": "attention.dense",
           "feed_forward.w1": "mlp.dense_h_to_4h", "feed_forward.w2": "mlp.dense_4h_to_h",
           "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"},
    layers="gpt_neox.layers",
    # older GPT-NeoX checkpoints hold the causal mask and RoPE's buffers (transformers ignores them too)
    ignored=("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq"),
)
NAMES = {"llama": LLAMA_NAMES, "gpt_neox": GPT_NEOX_NAMES}
_OUR_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_OUR_EXPERTS = re.compile(r"layers\.(\d+)\.moe\.experts\.(w[123])")
_HF_EXPERT = re.compile(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight")


def _hf_expert_name(layer: str, expert: int | str, weight: str) -> str:
    return f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{weight}.weight"


def to_hf_tensors(name: str, tensor: torch.Tensor, family: str = "llama") -> Iterator[tuple[str, torch.Tensor]]:
    """Our parameter as Hugging Face's tensors: one, or one per expert of a stacked expert weight."""
    match = _OUR_EXPERTS.fullmatch(name)
    if match is None:
        yield to_hf_name(name, family), tensor
        return
    for expert in range(tensor.shape[0]):
        yield _hf_expert_name(match.group(1), expert, match.group(2)), tensor[expert]


def to_hf_name(name: str, family: str = "llama") -> str:
    """`layers.3.attention.wq.weight` -> `model.layers.3.self_attn.q_proj.weight` (GPT-NeoX:
    `layers.3.attention.wqkv.bias` -> `gpt_neox.layers.3.attention.query_key_value.bias`; not for the
    stacked expert weights: `to_hf_tensors`)."""
    hf = NAMES[family].to_hf(name)
    if hf is None:
        raise KeyError(f"no Hugging Face name for parameter {name!r}")
    return hf


def from_hf_name(name: str, family: str = "llama") -> str | None:
    """The inverse of `to_hf_name`; None for names our model has no parameter for (an expert's
    weight: `_from_hf_expert`)."""
    return NAMES[family].from_hf(name)


def _from_hf_expert(name: str) -> tuple[str, int] | None:
    """`model.layers.3.block_sparse_moe.experts.5.w1.weight` -> (`layers.3.moe.experts.w1`, 5)."""
    match = _HF_EXPERT.fullmatch(name)
    if match is None:
        return None
    layer, expert, weight = match.groups()
    return f"layers.{layer}.moe.experts.{weight}", int(expert)


def _describe(name: str, family: str) -> str:
    """Our parameter by its Hugging Face name(s), for messages."""
    match = _OUR_EXPERTS.fullmatch(name)
    return _hf_expert_name(match.group(1), "*", match.group(2)) + " (stacked)" if match else to_hf_name(name, family)


def _is_distributed(distributed: bool) -> bool:
    if distributed and not dist.is_initialized():
        raise RuntimeError("distributed=True needs an initialised process group")
    return distributed


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a Hugging Face model directory, as transformers picks them: safetensors
    (sharded by its index, or single) before PyTorch `.bin` (sharded or single)."""
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{path}: not a weight index ({exc}); write it again with save_pretrained") from None
        files = [directory / file for file in sorted(set(weight_map.values()))]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{path} lists files that are not there: {', '.join(absent)}")
        return files
    raise FileNotFoundError(f"{directory} holds no weights (none of {', '.join(WEIGHT_FILES)}); give the model's "
                            "directory, or set init_from_scratch: 1 to train its architecture from random weights")


def _tensors(path: Path) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(name, loader) of every tensor of one weight file, read lazily."""
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is no dict
                yield name, lambda name=name: f.get_tensor(name)
        return
    # weights_only: a .bin is a pickle, and only tensors may come out of it, never code.
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    for name, tensor in state.items():
        yield name, lambda tensor=tensor: tensor


def _read_hf_state_dict(
    directory: Path, expected: dict[str, torch.Size], tied: bool, family: str = "llama"
) -> dict[str, torch.Tensor]:
    """Our names -> tensors from the weight files; every mismatch is reported at once."""
    names = NAMES[family]
    state: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}  # our stacked name -> expert -> its tensor
    unexpected: list[str] = []
    for path in weight_files(directory):
        for hf_name, load in _tensors(path):
            name, expert = names.from_hf(hf_name), _from_hf_expert(hf_name)
            # Some tied checkpoints still store lm_head; the model ties it to the embedding
            # anyway. Older checkpoints store buffers (RoPE's inv_freq, ...), which we recompute.
            if (tied and name == "output.weight") or names.is_ignored(hf_name):
                continue
            if expert is not None and expert[0] in expected and expert[1] < expected[expert[0]][0]:
                experts.setdefault(expert[0], {})[expert[1]] = load()
            elif name is None or name not in expected:
                unexpected.append(hf_name)
            else:
                state[name] = load()
    missing = []
    for name in expected:
        if _OUR_EXPERTS.fullmatch(name):
            absent = [e for e in range(expected[name][0]) if e not in experts.get(name, {})]
            layer, weight = _OUR_EXPERTS.fullmatch(name).groups()
            missing += [_hf_expert_name(layer, e, weight) for e in absent]
            if not absent:
                state[name] = torch.stack([experts[name][e] for e in range(expected[name][0])])
        elif name not in state:
            missing.append(to_hf_name(name, family))
    shapes = [f"{_describe(name, family)}: file {tuple(t.shape)}, model {tuple(expected[name])}"
              for name, t in state.items() if t.shape != expected[name]]
    found = {"missing keys": missing, "unexpected keys": unexpected, "shape mismatches": shapes}
    problems = "; ".join(f"{label}: {', '.join(items)}" for label, items in found.items() if items)
    if problems:
        raise ValueError(f"Hugging Face weights in {directory} do not fit the model; {problems}")
    return state


def _padded(state: dict[str, torch.Tensor], model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The vocabulary's rows of the files, zero rows below them up to a padded model's rows."""
    for name in VOCAB_ROWS:
        if name in state and name in model_state and state[name].shape[0] < model_state[name].shape[0]:
            rows = model_state[name].shape[0]
            state[name] = torch.cat([state[name], state[name].new_zeros((rows - state[name].shape[0],
                                                                         *state[name].shape[1:]))])
    return state


def load_hf_weights(model: nn.Module, directory: str | Path, distributed: bool = False,
                    exclude: Collection[str] = ()) -> None:
    """Load a Hugging Face model directory's weights (safetensors or `.bin`, single or sharded), all but
    the parameters named in `exclude` (LoRA's adapters), which the files do not hold and keep their values.

    The model must hold real storage (after `to_empty` when built on the meta device) and its
    non-persistent RoPE buffers must be initialised; only persistent weights come from the files.
    Tensors are cast to the model's dtypes.

    `distributed=True` is a collective: rank 0 alone reads the files and `set_model_state_dict`
    broadcasts each tensor into every rank's shards. With False this process reads the files
    itself, into a plain model or (when a process group is up) a sharded one.
    """
    directory = Path(directory)
    args = getattr(model, "args", None)
    tied = bool(getattr(args, "tie_embeddings", False))
    family = getattr(args, "family", "llama")
    # A sharded model's state_dict holds DTensors, whose shape is the global one.
    local = {k: v for k, v in model.state_dict().items() if not (tied and k == "output.weight") and k not in exclude}
    # the files hold the vocabulary's rows; a padded model's extra rows are zeros (_padded)
    vocab = getattr(args, "vocab_size", None)
    expected = {k: torch.Size((vocab, *v.shape[1:])) if k in VOCAB_ROWS and vocab else v.shape
                for k, v in local.items()}
    if not _is_distributed(distributed):
        state = _padded(_read_hf_state_dict(directory, expected, tied, family), local)
        if tied:
            state["output.weight"] = state["tok_embeddings.weight"]
        if dist.is_initialized():  # the parameters may be DTensors: copy each rank's slice
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=not exclude))
        else:
            _load_all_but(model, state, exclude)
        return

    state, error = {}, None
    if dist.get_rank() == 0:
        try:
            state = _padded(_read_hf_state_dict(directory, expected, tied, family), local)
            state = {k: v.to(local[k].dtype) for k, v in state.items()}
        except Exception as exc:  # noqa: BLE001 - any failure (a corrupt pickle too) must reach every rank
            error = exc
    # Every rank must raise the same error, or the others would wait in the broadcast forever.
    box = [error]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise box[0]
    if tied and state:
        state["output.weight"] = state["tok_embeddings.weight"]
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=not exclude)
    set_model_state_dict(model, state, options=options)


def _load_all_but(model: nn.Module, state: dict[str, torch.Tensor], exclude: Collection[str]) -> None:
    """load_state_dict of every tensor but those `exclude` names, which `state` must lack (copy_ casts to each
    parameter's dtype)."""
    missing, unexpected = model.load_state_dict(state, strict=not exclude)
    if set(missing) - set(exclude) or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")


def export_hf(
    model: nn.Module,
    spec: ModelSpec,
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    pp_group: dist.ProcessGroup | None = None,
) -> None:
    """Write the model as a Hugging Face directory (safetensors + config) of the spec's
    architecture: LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM (an MoE spec) or
    GPTNeoXForCausalLM.

    When a process group is up this is a collective (gathering the full state dict of a sharded
    model): every rank calls it, rank 0 writes, and all return once the files are complete. Under
    pipeline parallelism `model` is this rank's stages and `pp_group` its pipeline peers, whose
    stages reach rank 0's file too.

    The files are written into a staging directory inside `out_dir` and moved into place once all
    are complete; on a failure what was written is removed, so a failed export (a full disk, a
    kill) never leaves a truncated artifact to be uploaded as the model.
    """
    check_export_dtype(dtype)
    state = gathered_state(model, pp_group)
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_model(state, spec, Path(out_dir), dtype, max_shard_bytes)
    if dist.is_initialized():
        dist.barrier()


def check_export_dtype(dtype: torch.dtype) -> None:
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"export dtype must be bfloat16, float16 or float32, not {dtype}")


def gathered_state(model: nn.Module, pp_group: dist.ProcessGroup | None = None) -> dict[str, torch.Tensor]:
    """The model's full tensors by our names: all of them without a process group; under one (a
    collective: every rank calls it) on rank 0, and {} on the other ranks."""
    if not dist.is_initialized():
        return model.state_dict()
    if pp_group is not None:
        return _stages_state(model, pp_group)
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _stages_state(model: nn.Module, pp_group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    """Rank 0: the full tensors of every pipeline stage (global names); other ranks: {}. Every
    rank gathers its stage's full tensors (a collective within the stage); rank 0's pipeline peers
    send theirs to it."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    state = {name: tensor.cpu() for name, tensor in state.items()}
    if 0 not in dist.get_process_group_ranks(pp_group):
        return {}
    parts = [None] * dist.get_world_size(pp_group) if dist.get_rank() == 0 else None
    dist.gather_object(state, parts, dst=0, group=pp_group)
    return {name: tensor for part in parts for name, tensor in part.items()} if parts else {}


def write_model(state: dict[str, torch.Tensor], spec: ModelSpec, out_dir: Path, dtype: torch.dtype,
                max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """The full state (our names) as a Hugging Face model directory, written as `write_staged` writes,
    config.json last: it is what tells a reader a model is there."""
    write_staged(out_dir, lambda staging: _write_hf(state, spec, staging, dtype, max_shard_bytes), "config.json")


def write_staged(out_dir: Path, write: Callable[[Path], None], last: str) -> None:
    """`write` into a staging directory, then each file renamed into `out_dir` (the same file system, so
    each rename is atomic), `last` last; on a failure nothing written stays."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir))
    moved: list[Path] = []
    try:
        write(staging)
        for file in sorted(staging.iterdir(), key=lambda f: f.name == last):
            file.replace(out_dir / file.name)
            moved.append(out_dir / file.name)
    except BaseException:
        for file in moved:
            file.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_hf(
    state: dict[str, torch.Tensor],
    spec: ModelSpec,
    out_dir: Path,
    dtype: torch.dtype,
    max_shard_bytes: int,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # a model padded for tensor parallelism exports its vocabulary's rows only (transformers' shapes)
    state = {name: t[:spec.vocab_size] if name in VOCAB_ROWS else t for name, t in state.items()}
    names = [name for name in state if not (spec.tie_embeddings and name == "output.weight")]
    family = "gpt_neox" if spec.is_gpt_neox else "llama"
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards: list[list[str]] = [[]]
    size = total = 0
    for name in names:
        nbytes = state[name].numel() * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
        total += nbytes
    files = [SINGLE_FILE] if len(shards) == 1 else [
        f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    for file, shard in zip(files, shards):
        # Cast one shard at a time: the gathered full-precision state is already in host memory.
        tensors = {hf_name: t.detach().to("cpu", dtype).contiguous()
                   for n in shard for hf_name, t in to_hf_tensors(n, state[n], family)}
        # transformers checks the framework recorded in the safetensors metadata.
        save_file(tensors, str(out_dir / file), metadata={"format": "pt"})
    if len(shards) > 1:
        weight_map = {hf_name: file for file, shard in zip(files, shards) for n in shard
                      for hf_name, _ in to_hf_tensors(n, state[n], family)}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_json(out_dir / INDEX_FILE, index)
    config = hf_config(spec)
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", {"_from_model_config": True, **generation_config(spec)})


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
