"""One fork server per test process, holding torch's heavy modules imported once: a rank it
starts is running in milliseconds, where a fresh interpreter spends ~3 s of CPU importing torch
(torchrun's agent another 1.4 s), most of the suite's multi-process time on 2 cores.

Only torch's own modules are preloaded: they read no environment a test changes. Modules that do
(huggingface_hub reads HF_HUB_OFFLINE and HF_HOME when imported, smlaunch reads SM_* and
SAGEMAKER_BASE_DIR), and smlaunch itself, are imported by each rank, in the environment its
test gives it."""

from __future__ import annotations

import multiprocessing

PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.checkpoint", "torch.distributed.pipelining", "torch.nn.attention.bias",
           "torch.nn.attention.flex_attention"]


def start_method() -> str:
    """"forkserver", with PRELOAD as the server's imports (set before its first start)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    return "forkserver"
