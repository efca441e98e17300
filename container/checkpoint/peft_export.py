"""A LoRA job's model artifact: the adapter in peft's format, and with `merge_weights` the merged
model in Hugging Face's (docs/lora.md).

The adapter is what peft's `save_pretrained` writes: `adapter_config.json` and
`adapter_model.safetensors`, its tensors named as peft names them for the transformers model
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`; a module trained whole under
its own name, `base_model.model.lm_head.weight`), so `PeftModel.from_pretrained(base, model_dir)`
loads it. Written with safetensors and json: the runtime does not need peft. The merged model
(each targeted weight W + scaling x B @ A, the adapters gone) goes to `merged/` through
container.checkpoint.hf_export, beside the adapter and not over it: transformers would take a
directory holding adapter_config.json for an adapter and look for its base.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from container.checkpoint import hf_export as hf
from container.models.lora import is_adapter, saved_module_names
from launcher.wire.training.lora import LoraSettings
from launcher.wire.training.models import ModelSpec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED = "merged"
_PEFT_PREFIX = "base_model.model."


def peft_name(name: str, family: str = "llama") -> str:
    """Our name -> peft's saved name: `layers.0.attention.wq.lora_A.weight` ->
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, `output.weight` ->
    `base_model.model.lm_head.weight`."""
    if not is_adapter(name):
        return _PEFT_PREFIX + hf.to_hf_name(name, family)
    module, part, _ = name.rsplit(".", 2)  # layers.0.attention.wq, lora_A, weight
    return f"{_PEFT_PREFIX}{hf.to_hf_name(module + '.weight', family).removesuffix('.weight')}.{part}.weight"


def adapter_config(lora: LoraSettings, base: str | None) -> dict:
    """adapter_config.json as peft's LoraConfig reads it (what is left out takes peft's defaults)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": lora.r,
            "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": list(lora.targets),
            "modules_to_save": list(lora.modules_to_save) or None, "use_rslora": lora.rslora, "use_dora": False,
            "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True}


def adapter_tensors(state: dict[str, torch.Tensor], saved: list[str], family: str) -> dict[str, torch.Tensor]:
    """The adapters and the modules trained whole (`saved`: our module names) under peft's names."""
    trained = tuple(f"{module}." for module in saved)
    return {peft_name(name, family): tensor for name, tensor in state.items()
            if is_adapter(name) or name.startswith(trained)}


def merged_state(state: dict[str, torch.Tensor], lora: LoraSettings) -> dict[str, torch.Tensor]:
    """The full state with each adapted weight merged (W + scaling x B @ A, in fp32, as peft's
    merge_and_unload computes it up to its order) and the adapters left out."""
    merged = {}
    for name, tensor in state.items():
        if is_adapter(name):
            continue
        module = name.removesuffix(".weight")
        if f"{module}.lora_A.weight" in state:
            a, b = state[f"{module}.lora_A.weight"].float(), state[f"{module}.lora_B.weight"].float()
            tensor = (tensor.float() + (b @ a) * lora.scaling).to(tensor.dtype)
        merged[name] = tensor
    return merged


def export_lora(model: nn.Module, spec: ModelSpec, lora: LoraSettings, out_dir: Path, dtype: torch.dtype,
                base: str | None) -> None:
    """Write the adapter (and with lora.merge the merged model under merged/) into `out_dir`; a
    collective under a process group, as hf_export.export_hf is: rank 0 writes."""
    hf.check_export_dtype(dtype)
    state = hf.gathered_state(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_adapter(state, saved_module_names(model, lora), spec, lora, out_dir, dtype, base)
        if lora.merge:
            hf.write_model(merged_state(state, lora), spec, out_dir / MERGED, dtype)
    if dist.is_initialized():
        dist.barrier()


def write_adapter(state: dict[str, torch.Tensor], saved: list[str], spec: ModelSpec, lora: LoraSettings,
                  out_dir: Path, dtype: torch.dtype, base: str | None) -> None:
    family = "gpt_neox" if spec.is_gpt_neox else "llama"
    tensors = {name: t.detach().to("cpu", dtype).contiguous()
               for name, t in adapter_tensors(state, saved, family).items()}

    def write(staging: Path) -> None:
        save_file(tensors, str(staging / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (staging / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(lora, base), indent=2) + "\n")

    hf.write_staged(out_dir, write, ADAPTER_CONFIG)
