"""LoRA adapters on the runtime's linear layers, as peft's LoRA computes them (docs/lora.md).

Each targeted nn.Linear becomes a `LoRALinear`: the same frozen weight (and bias) under the same
names, so weight loading, checkpoints and FSDP see the base as before, plus `lora_A` [r, in] and
`lora_B` [out, r]. Its output is peft's: base(x) + lora_B(lora_A(dropout(x))) x scaling, dropout on
the adapter's input only. A starts as peft's (kaiming-uniform, a = sqrt(5)), B at zero, so the first
step's loss is the base model's. Every parameter but the adapters and the modules trained whole
(`lora_modules_to_save`) is frozen: no gradient, so no optimizer state, and clipping sees the rest.

Targets are named as peft names them, by Hugging Face's module names (launcher.wire.training.lora);
container.checkpoint.hf_export's table maps them to the runtime's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from container.checkpoint.hf_export import NAMES
from launcher.wire.training.lora import LoraSettings

ADAPTER_PARTS = ("lora_A", "lora_B")


class LoRALinear(nn.Linear):
    """A frozen linear layer and its low-rank adapter; built from the layer it replaces, on its device
    (the meta device too: a delayed init then takes the adapters from rank 0's copy, as it takes the base)."""

    def __init__(self, base: nn.Linear, lora: LoraSettings):
        nn.Module.__init__(self)  # not nn.Linear's: the base's parameters are taken, not made
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, lora.r, bias=False, **factory)
        self.lora_B = nn.Linear(lora.r, base.out_features, bias=False, **factory)
        self.lora_dropout = nn.Dropout(lora.dropout) if lora.dropout else nn.Identity()
        self.scaling = lora.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, self.bias)
        # peft's order: the base's output plus the scaled update, the adapter in its own dtype
        update = self.lora_B(self.lora_A(self.lora_dropout(x.to(self.lora_A.weight.dtype))))
        return (result + update * self.scaling).to(result.dtype)

    @torch.no_grad()
    def reset_adapter(self, generator: torch.Generator) -> None:
        """peft's init_lora_weights=True: A kaiming-uniform with a = sqrt(5) (nn.Linear's own), B zero.
        A is drawn on the host, so every device draws the same numbers from the same generator."""
        values = torch.empty(self.lora_A.weight.shape, dtype=self.lora_A.weight.dtype)
        self.lora_A.weight.copy_(nn.init.kaiming_uniform_(values, a=math.sqrt(5), generator=generator))
        nn.init.zeros_(self.lora_B.weight)


def _family(model: nn.Module) -> str:
    return getattr(model.args, "family", "llama")


def target_paths(model: nn.Module, lora: LoraSettings) -> list[str]:
    """The block-relative paths (`attention.wq`) of the runtime's modules that Hugging Face's kinds
    (`q_proj`) name."""
    layer_names = NAMES[_family(model)].layer
    return [ours for ours, hf in layer_names.items() if hf.rsplit(".", 1)[-1] in lora.targets]


def saved_module_names(model: nn.Module, lora: LoraSettings) -> list[str]:
    """The runtime's names (`output`) of the modules trained whole (`lm_head`)."""
    top = NAMES[_family(model)].top
    return [ours.rsplit(".", 1)[0] for ours, hf in top.items() if hf.rsplit(".", 2)[-2] in lora.modules_to_save]


def apply_lora(model: nn.Module, lora: LoraSettings, seed: int) -> None:
    """Replace each targeted linear layer of every block by its LoRALinear, initialise the adapters
    from `seed` (not the global generator: a delayed init's copy on rank 0 draws the same), and
    freeze all but the adapters and the modules trained whole."""
    paths = target_paths(model, lora)
    for block in model.layers.values():
        for path in paths:
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            setattr(parent, name, LoRALinear(getattr(parent, name), lora))
    reset_adapters(model, seed)
    trained = tuple(f"{name}." for name in saved_module_names(model, lora))
    for name, parameter in model.named_parameters():
        parameter.requires_grad = is_adapter(name) or name.startswith(trained)


def reset_adapters(model: nn.Module, seed: int) -> None:
    """Every adapter at its initial value, drawn in module order from a generator seeded with `seed`;
    nothing on the meta device (materialisation fills it)."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, LoRALinear) and module.lora_A.weight.device.type != "meta":
            module.reset_adapter(generator)


def is_adapter(name: str) -> bool:
    """Whether a parameter's name is an adapter's (`layers.0.attention.wq.lora_A.weight`)."""
    return any(f".{part}." in name for part in ADAPTER_PARTS)


def adapter_names(model: nn.Module) -> list[str]:
    """The adapters' names in the model's state dict (which wrappers, such as activation checkpointing's,
    leave out of the names, where named_parameters has them)."""
    return [name for name in model.state_dict() if is_adapter(name)]

