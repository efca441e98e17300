"""Pipeline parallelism (pipeline_parallel_degree, an smlaunch extension of the SMP parameters)
with torch.distributed.pipelining, in torchtitan's manner.

Stages: the model is built and initialised whole on every rank (so its weights are those of one
process with the same seed), then cut into pp x pipeline_virtual_stages stages of consecutive
layers. A stage is the Transformer without the modules it does not own, under their original
names (`layers.<i>...`): DCP checkpoints and the Hugging Face export name parameters as one
process does, and checkpoints reshard across pipeline degrees. The embedding lives on the first
stage, the final norm and output layer (and the loss) on the last. Each stage gets tensor
parallelism, activation checkpointing and FSDP2 over its own pipeline rank's meshes, as the whole
model gets them without pipelining. Rank r holds stages r, r + pp, ... (interleaved 1F1B) and
one `model` for everything outside the schedule: the stage itself, or a Transformer over all its
stages' modules.

A step: the data-parallel rank's batch (train_batch_size x gradient_accumulation_steps sequences)
is what the schedule cuts into `microbatches`. The last stage computes each microbatch's summed
token loss (container.loss, chunked as without pipelining) and the schedule's loss_fn divides it by
the step's global token count, with the schedule's gradient scaling off: the gradients are those
of one process, as everywhere in the runtime (trainer.py). RoPE positions (the cp chunk's, under
context parallelism) go to every stage as a keyword argument, so a stage whose input is
sequence-parallel hidden states still rotates by the right positions; so do a packed row's
document ids (document masking, docs/data.md), which every stage's attention masks by.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from container.distributed.runtime import Runtime, refuse
from container.distributed.tensor_parallel import loss_context
from container.models.llama import Transformer, build_model
from launcher.wire.training.layout import PipelineJob, num_stages, pipeline_problems, stage_layers
from launcher.wire.training.models import ModelSpec
from launcher.wire.training.run_settings import RunSettings

log = logging.getLogger("smlaunch")
# a stage's index -> PipelineStage's static metadata ({"input_args": ..., "output_args": ...}), in place of
# the shapes the stages infer and exchange at the first step (a trace's: container.trace.pipeline)
StageShapes = Callable[[int], dict[str, tuple[torch.Tensor, ...]]]
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


class StageModule(Transformer):
    """Some of a Transformer's modules, sharing them (not copies); the forward is Transformer's,
    which passes over what is absent. It passes the loss chunk size, which the schedule cannot
    hand it (it cuts every keyword argument into microbatches)."""

    def __init__(self, source: Transformer, layers: dict[str, nn.Module], first: bool, last: bool,
                 loss_chunk_tokens: int):
        nn.Module.__init__(self)  # not Transformer's: that would build every layer
        self.args = source.args
        self.loss_chunk_tokens = loss_chunk_tokens
        self.tok_embeddings = source.tok_embeddings if first else None
        self.layers = nn.ModuleDict(layers)
        self.norm = source.norm if last else None
        self.output = source.output if last else None
        self.register_buffer("rope_cos", source.rope_cos, persistent=False)
        self.register_buffer("rope_sin", source.rope_sin, persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, documents: torch.Tensor | None = None):
        return super().forward(tokens, positions, labels=labels, loss_chunk_tokens=self.loss_chunk_tokens,
                               documents=documents)


def check_pipeline(rt: Runtime, spec: ModelSpec, s: RunSettings, pretrained_weights: bool) -> None:
    """The client's pipeline rules (launcher.wire.training.layout), for a job built by hand."""
    job = PipelineJob(num_layers=spec.num_layers, batch_per_rank=s.micro_batch * s.grad_accum,
                      tied_embeddings=spec.tie_embeddings, moe=spec.is_moe, fp8=s.fp8.enabled,
                      delayed_init=s.delayed_init, pretrained_weights=pretrained_weights,
                      validation=bool(s.validation_freq))
    refuse(pipeline_problems(rt.params, job),
           where=lambda p: "hyperparameter " if p.hyperparameter else "mp_parameters ")


class Pipeline:
    """This rank's stages and their schedule; `step` runs one training step's forward and backward."""

    def __init__(self, rt: Runtime, stages: list[StageModule], indices: list[int], n_stages: int,
                 microbatches: int, shapes: StageShapes | None = None):
        self.rt, self.microbatches, self.shapes = rt, microbatches, shapes
        self.stages = [PipelineStage(module, index, n_stages, rt.device, group=rt.pp_group,
                                     **(shapes(index) if shapes else {}))
                       for module, index in zip(stages, indices)]
        schedule = SCHEDULES[rt.params.schedule]
        first = self.stages if schedule is ScheduleInterleaved1F1B else self.stages[0]
        # scale_grads off: the loss is already a share of the step's global mean (the module docstring)
        self.schedule = schedule(first, microbatches, loss_fn=self._loss, scale_grads=False)
        self._sums: list[torch.Tensor] = []
        self._total: torch.Tensor | None = None

    def _loss(self, output: tuple[torch.Tensor, torch.Tensor], _labels: torch.Tensor) -> torch.Tensor:
        """The last stage's output is (summed token loss, label tokens) of one microbatch; the
        labels went to it as a keyword argument, the schedule's target only marks the microbatch."""
        self._sums.append(output[0].detach())
        return output[0] / self._total

    def step(self, micro: list[dict], total_tokens: torch.Tensor) -> torch.Tensor:
        """Forward and backward of this step's micro-batches through the pipeline; returns the
        summed token loss of this data-parallel rank's batch, on every stage."""
        tokens = torch.cat([b["input_ids"] for b in micro])
        labels = torch.cat([b["labels"] for b in micro])
        # every keyword argument is cut into the schedule's microbatches along the rows
        positions = torch.cat([_rows(b.get("positions"), b["input_ids"]) for b in micro])
        kwargs = {"positions": positions, "labels": labels}
        if any("documents" in b for b in micro):  # a batch without them is one document a row
            kwargs["documents"] = torch.cat([b["documents"] if "documents" in b else
                                             torch.zeros_like(b["input_ids"]) for b in micro])
        self._sums, self._total = [], total_tokens
        with loss_context(self.rt.layout.tp):
            self.schedule.step(tokens, target=labels, **kwargs, return_outputs=False)
        # on the first step the stages infer their shapes with one more forward and loss, before the
        # microbatches: the step's losses are the last `microbatches`
        sums = self._sums[-self.microbatches:]
        loss = torch.stack(sums).sum() if sums else torch.zeros((), device=self.rt.device)
        dist.all_reduce(loss, group=self.rt.pp_group)  # only the last stage has it
        return loss


def _rows(positions: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor:
    """One micro-batch's RoPE positions, one row per sequence: a packed row's own ([B, S]), or the
    positions every row shares ([S]: 0..S-1, or the cp chunk's global ones)."""
    if positions is None:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
    return positions if positions.dim() == 2 else positions.expand(tokens.shape[0], -1)


def build_pipeline(rt: Runtime, spec: ModelSpec, s: RunSettings,
                   parallelize: Callable[[Runtime, nn.Module, RunSettings], None],
                   pretrained_weights: bool = False, vocab_rows: int | None = None,
                   device: torch.device | None = None,
                   shapes: StageShapes | None = None) -> tuple[Transformer, Pipeline]:
    """(this rank's model: its stages' modules under their global names, the pipeline to step).
    `device`: where the model is built (a trace's: meta), when not the rank's."""
    check_pipeline(rt, spec, s, pretrained_weights)
    full = build_model(spec, s.seq_len, device=device or rt.device, vocab_rows=vocab_rows)
    torch.manual_seed(s.seed)  # as trainer.build_parallel_model seeds it: one process's weights
    full.init_weights()
    if rt.is_main:
        log.info("model %s: %s parameters, random weights (seed %d)", spec.name,
                 f"{full.num_params(exclude_embedding=False):,}", s.seed)
    pp, n_stages = rt.layout.pp, num_stages(rt.params)
    indices = list(range(rt.pp_rank, n_stages, pp))
    stages = [_stage(full, index, n_stages, s.loss_chunk_tokens) for index in indices]
    del full  # the other ranks' layers go with it
    for stage in stages:
        parallelize(rt, stage, s)
    model = stages[0] if len(stages) == 1 else _merged(stages)
    if rt.is_main:
        log.info("pipeline: %d stages over %d ranks (%s, %d microbatches); rank 0 holds layers %s",
                 n_stages, pp, rt.params.schedule, rt.params.microbatches, ", ".join(model.layers.keys()))
    return model, Pipeline(rt, stages, indices, n_stages, rt.params.microbatches, shapes)


def _stage(full: Transformer, index: int, n_stages: int, loss_chunk_tokens: int) -> StageModule:
    layers = {str(i): full.layers[str(i)] for i in stage_layers(full.args.n_layers, n_stages, index)}
    return StageModule(full, layers, first=index == 0, last=index == n_stages - 1,
                       loss_chunk_tokens=loss_chunk_tokens)


def _merged(stages: list[StageModule]) -> StageModule:
    """One module over several stages' (parallelized) modules, for the optimizer, clipping,
    checkpoints and export, which know the parameters by their global names. Never run: the
    stages run."""
    first, last = stages[0], stages[-1]
    merged = StageModule(first, {i: layer for stage in stages for i, layer in stage.layers.items()},
                         first=first.tok_embeddings is not None, last=False, loss_chunk_tokens=0)
    merged.norm, merged.output = last.norm, last.output
    return merged
