"""The peer a team would write first: a plain Hugging Face transformers loop, one process.

`LlamaForCausalLM` built from the same shape's config.json (launcher.wire.training.hf_config, as smlaunch
exports it), attn_implementation="sdpa", random weights from the same seed, fp32 weights under
bf16 autocast (mixed precision, as train.py's FSDP2 and torchtitan train), fused AdamW (foreach on
the CPU) with the same learning rate, betas and weight decay, gradient clipping at 1.0, and the
same synthetic rows as train.py's `dataset_type synthetic` (container.data.loader.SyntheticSource).
`compile=1` compiles each decoder layer (regional compilation: accelerate's `compile_regions`, the
form Hugging Face documents for training); `activation_checkpointing=1` is transformers'
gradient checkpointing. Each step is timed as train.py times its own: synchronize, the host clock,
the batch, the step and `loss.item()`, synchronize.
Run: python -m bench.gpu.hf_loop '<run as JSON>'; the last line is `RESULT <json>`.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from container.data.loader import SyntheticSource
from launcher.wire.training.hf_config import hf_config
from launcher.wire.training.models import PRESETS
from launcher.wire.training.run_settings import DEFAULT_BETAS


def build(hp: dict, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = PRESETS[hp["model_preset"]]
    config = LlamaConfig(**{k: v for k, v in hf_config(spec).items() if k not in ("architectures", "model_type")})
    torch.manual_seed(hp["seed"])
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32).to(device)
    if hp.get("activation_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hp.get("compile"):
        for layer in model.model.layers:
            layer.compile()
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp["lr"], betas=DEFAULT_BETAS,
                                  weight_decay=hp["weight_decay"], fused=fused, foreach=not fused)
    return spec, model, optimizer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(hp: dict) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec, model, optimizer = build(hp, device)
    data = SyntheticSource(hp["max_context_width"], spec.vocab_size, hp["seed"])
    batch = hp["train_batch_size"]
    cuda = device.type == "cuda"
    step_s, losses = [], []
    for step in range(hp["max_steps"]):
        sync(device)
        began = time.perf_counter()
        rows = data.read(step * batch, batch)
        ids, labels = rows["input_ids"].to(device), rows["labels"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        # the rows' labels are already shifted (the last ignored), so the model's own loss, which
        # shifts, is not used; fp32 logits as transformers' loss takes them
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        sync(device)
        step_s.append(time.perf_counter() - began)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    return {"step_s": step_s, "losses": losses, "peak_memory_gib": peak}


if __name__ == "__main__":
    result = train(json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
