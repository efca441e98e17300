"""A traced rank's pipeline stages: their shapes given up front, not agreed with peers.

At its first step torch's schedule (2.13) has its stages agree, over the process group, whether
every stage knows its shapes (a vote of values sent stage to stage), and, where one does not, each
stage sends the next its output's shapes as a pickled object. A traced rank has no peers: the fake
group returns no values. So the trace gives each stage its shapes as PipelineStage's static
metadata (`stage_shapes`), which the runtime's Pipeline passes on, and settles the vote as every
stage would vote with them (`settle_the_vote`). What passes between stages is the hidden state of a
microbatch: its rows ([the rank's batch] / microbatches), the rank's share of the sequence (cp's
chunk, and tp's under sequence parallelism), the model's width, in the compute dtype. During the
warm-up step `OutputCheck` holds each stage's own output to those shapes, so a wrong formula
fails the trace instead of tracing the wrong tensors.
"""

from __future__ import annotations

import torch
from torch.distributed.pipelining import schedules
from torch.distributed.pipelining._utils import InferenceMode

from container.distributed.pipeline import Pipeline, StageShapes
from container.distributed.runtime import Runtime
from launcher.wire.training.models import ModelSpec
from launcher.wire.training.run_settings import RunSettings


def vote_unsupported() -> str | None:
    """Why this torch's schedule cannot be traced here, or None (the vote is torch 2.13's)."""
    if hasattr(schedules._PipelineSchedule, "_warmup_p2p") and hasattr(InferenceMode, "STATIC"):
        return None
    return (f"torch {torch.__version__}'s pipeline schedule agrees its stages' shapes otherwise than the trace "
            "knows (torch 2.13's vote)")


def microbatch_tokens(rt: Runtime, s: RunSettings) -> torch.Tensor:
    """One microbatch's tokens as the first stage takes them: the rank's batch cut into
    `microbatches`, each row its cp chunk (on the meta device: a shape)."""
    rows = s.micro_batch * s.grad_accum // rt.params.microbatches
    return torch.empty(rows, s.seq_len // rt.layout.cp, dtype=torch.long, device="meta")


def hidden_state(rt: Runtime, s: RunSettings, spec: ModelSpec) -> torch.Tensor:
    """One microbatch's hidden state as a stage sends it: tp > 1 cuts the sequence (sequence
    parallel between the blocks)."""
    rows, seq = microbatch_tokens(rt, s).shape
    dtype = torch.bfloat16 if s.bf16 else torch.float32
    return torch.empty(rows, seq // rt.layout.tp, spec.hidden_size, dtype=dtype, device="meta", requires_grad=True)


def stage_shapes(rt: Runtime, s: RunSettings, spec: ModelSpec, n_stages: int) -> StageShapes:
    tokens, hidden = microbatch_tokens(rt, s), hidden_state(rt, s, spec)
    # the last stage's output: (summed token loss, label tokens), which it sends nowhere
    last = (torch.empty((), device="meta", requires_grad=True), torch.empty((), dtype=torch.long, device="meta"))

    def shapes(index: int) -> dict[str, tuple[torch.Tensor, ...]]:
        return {"input_args": (tokens,) if index == 0 else (hidden,),
                "output_args": last if index == n_stages - 1 else (hidden,)}

    return shapes


def settle_the_vote(pipe: Pipeline) -> None:
    """Every stage has its shapes: the vote's outcome, without its values from peers."""
    def vote(stages, _has_backward, _p2p_done) -> None:
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    pipe.schedule._warmup_p2p = vote


class OutputCheck:
    """Each non-last stage's output, held to the shapes the trace declared for it (the next stage's input)."""

    def __init__(self, pipe: Pipeline) -> None:
        self.hooks = [stage.submod.register_forward_hook(self._check(pipe.shapes(stage.stage_index)["output_args"][0]))
                      for stage in pipe.stages if not stage.is_last]

    @staticmethod
    def _check(declared: torch.Tensor):
        expected = (tuple(declared.shape), declared.dtype)

        def hook(_module, _args, output) -> None:
            found = (tuple(output.shape), output.dtype)
            if found != expected:
                raise RuntimeError(f"a pipeline stage's output is {found}, where the trace gave the next stage "
                                   f"{expected}: the trace's shapes are wrong for this layout (a bug: report it)")

        return hook

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
