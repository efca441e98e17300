"""`compile` (torchtitan's name): torch.compile of each transformer block and of the loss.

Order, as torchtitan's apply_compile: FP8 -> tensor parallel -> activation checkpointing ->
compile -> FSDP. After tensor parallelism, so each graph is traced over the DTensor projections
and their collectives (three torch 2.13 faults met there are worked around, below); after
activation checkpointing, so the checkpoint is inside the graph (dynamo traces it as one
higher-order op, and the selective policy's saved matmuls are chosen in the compiled graph);
before FSDP, whose all-gather and reduce-scatter hooks torch marks untraceable
(`torch._dynamo.disable`): they run eagerly around the block's graph.

A block is compiled in place (`Module.compile`, fullgraph): its parameters keep their names, so
checkpoints and the Hugging Face export are those of an eager run, and a graph break is an error,
never a silent return to eager. Every block has the same code and shapes, so they share one graph
(parameters are graph inputs). Under activation offloading the checkpoint inside the offloader is
compiled: the offloader's saved-tensor hooks cannot be traced, and around the compiled call they
see the graph's saved tensors as they see eager ones. What cannot compile is refused before
anything is built (launcher.wire.training.speed_rules.compile_issues, and LoRA's dropout:
launcher.wire.training.lora); a mixture-of-experts model here too. LoRA's adapters (LoRALinear) and
QLoRA's NF4 base compile in their blocks.

The loss compiles per chunk (container.loss `use_compiled`): the chunked loss's checkpoint stays
eager around it, and a micro-batch's last, shorter chunk is one more shape, compiled once.

Under tensor parallelism, torch 2.13 (measured at tp 2 on CPU against the eager run; docs/smp.md):
- AOTAutograd's cache hands a graph over DTensors back wrong (a run whose graphs came from it,
  another block's or rank's or an earlier run's, had a first loss of 6.998 or 5.077 against
  5.986), so it is off for the process (inductor's own cache of the compiled code stays on);
- a compiled block whose input is the view `DTensor.to_local()` returns (the embedding's output)
  passes no gradient back through it (the embedding's gradient was 0), so that output is copied
  into a tensor of its own first (one sequence slice of the hidden states per micro-batch);
- the loss over a vocabulary-sharded DTensor fails to compile with dynamic shapes (the shorter
  last chunk: "expected [s14] to have been codegen-ed"), so the loss compiles each chunk length
  as a static shape (container.loss), with or without tensor parallelism.

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
import torch._functorch.config
from torch import nn

from container import loss
from container.distributed.offload import Offloaded
from launcher.wire.training.speed_rules import MOE_FIX, MOE_REFUSAL

log = logging.getLogger("smlaunch")


def apply_compile(model: nn.Module, tp: int = 1) -> None:
    """Compile each of `model.layers` in place (fullgraph), and the loss's per-chunk function;
    `tp` > 1: the blocks are tensor-parallel (their parameters DTensors)."""
    if model.args.n_experts:  # validation refuses it first; a job built by hand fails here
        raise ValueError(f"{MOE_REFUSAL}; {MOE_FIX}")
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    if tp > 1:
        torch._functorch.config.enable_autograd_cache = False  # it restores DTensor graphs wrong (above)
        if model.tok_embeddings is not None:  # a pipeline stage after the first has none
            model.tok_embeddings.register_forward_hook(_own_storage)
    for block in model.layers.values():
        # offloading's saved-tensor hooks cannot be traced: they stay eager around the compiled checkpoint
        (block._checkpoint_wrapped_module if isinstance(block, Offloaded) else block).compile(fullgraph=True)
    loss.use_compiled(True)
    log.info("compile: torch.compile of %d blocks (fullgraph) and of the loss", len(model.layers))


def _own_storage(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    """The embedding's output copied out of `DTensor.to_local()`'s view, so the first compiled
    block's backward reaches the embedding (torch 2.13 drops the gradient of such a view)."""
    return output.clone()


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
