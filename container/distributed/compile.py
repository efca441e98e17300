"""`compile` (torchtitan's name): torch.compile of each transformer block and of the loss.

Order, as torchtitan's apply_compile: FP8 -> tensor parallel -> activation checkpointing ->
compile -> FSDP. After tensor parallelism, so a graph would be traced over the DTensor
projections (refused for now: launcher.config.compile_rules says why); after activation
checkpointing, so the checkpoint is inside the graph (dynamo traces it as one higher-order op,
and the selective policy's saved matmuls are chosen in the compiled graph); before FSDP, whose
all-gather and reduce-scatter hooks torch marks untraceable (`torch._dynamo.disable`): they run
eagerly around the block's graph.

A block is compiled in place (`Module.compile`, fullgraph): its parameters keep their names, so
checkpoints and the Hugging Face export are those of an eager run, and a graph break is an error,
never a silent return to eager. Every block has the same code and shapes, so they share one graph
(parameters are graph inputs). Under activation offloading the checkpoint inside the offloader is
compiled: the offloader's saved-tensor hooks cannot be traced, and around the compiled call they
see the graph's saved tensors as they see eager ones. What cannot compile is refused before
anything is built (launcher.config.compile_rules); a mixture-of-experts model here too.

The loss compiles per chunk (container.loss `use_compiled`): the chunked loss's checkpoint stays
eager around it, and a micro-batch's last, shorter chunk is one more shape, compiled once.

Recompilations: a graph is compiled again when a guard fails (a new shape, a mask where there was
none). Document boundaries are values, not shapes (positions and the dense mask keep their
shapes), so they compile nothing new; `graphs_compiled` counts the graphs, and the trainer logs
how many came after the first step. Dynamo's recompile limit failing the job instead of running
eager (`fail_on_recompile_limit_hit`) keeps the run compiled or stopped.
"""

from __future__ import annotations

import logging

import torch
import torch._dynamo
from torch import nn

from container import loss
from container.distributed.offload import Offloaded
from launcher.config.compile_rules import MOE_FIX, MOE_REFUSAL

log = logging.getLogger("smlaunch")


def apply_compile(model: nn.Module) -> None:
    """Compile each of `model.layers` in place (fullgraph), and the loss's per-chunk function."""
    if model.args.n_experts:  # validation refuses it first; a job built by hand fails here
        raise ValueError(f"{MOE_REFUSAL}; {MOE_FIX}")
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    for block in model.layers.values():
        # offloading's saved-tensor hooks cannot be traced: they stay eager around the compiled checkpoint
        (block._checkpoint_wrapped_module if isinstance(block, Offloaded) else block).compile(fullgraph=True)
    loss.use_compiled(True)
    log.info("compile: torch.compile of %d blocks (fullgraph) and of the loss", len(model.layers))


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompileCount:
    """The graphs the first step compiled, and the recompilations after it (step records'
    `recompiles`, and the job log's last word on compile)."""

    def __init__(self, on: bool):
        self.on, self.first = on, None

    def step_done(self) -> None:
        if self.on and self.first is None:
            self.first = graphs_compiled()

    def fields(self) -> dict:
        return {"recompiles": graphs_compiled() - self.first} if self.on and self.first is not None else {}

    def log(self) -> None:
        if self.on and self.first is not None:
            log.info("compile: %d graph(s) compiled by the first step, %d recompilation(s) after it", self.first,
                     graphs_compiled() - self.first)
