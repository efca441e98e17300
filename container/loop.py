"""The training loop: a step's forward, backward and update (`train_step`), validation, and the
steps of a run (`run_steps`) with each one's record, validation and checkpoint, then the last
checkpoint and the model's export, over the parts container.trainer builds (`Run`).

Loss normalisation: every rank's loss is its summed token loss over the *global* token count of
the step (all micro-batches, all data-parallel and context-parallel ranks); gradients are summed
(parallelize.py). So loss and gradients are those of one process seeing the whole global batch.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from container import optim
from container.args import Directories
from container.checkpoint import checkpointer as ckpt
from container.checkpoint import hf_export as hf
from container.checkpoint import pretrained, sigterm
from container.checkpoint.peft_export import MERGED, export_lora
from container.data import loader as data
from container.data.chat_source import ChatSource
from container.data.rows import attended_length
from container.distributed.compile import CompileCount
from container.distributed.runtime import Runtime
from container.distributed.tensor_parallel import loss_context
from container.fp8 import precompute_fp8_scales
from container.loss import label_tokens, token_loss_sum
from container.memory_snapshots import MemorySnapshots
from container.metrics import MetricsWriter, Throughput
from container.models.llama import Transformer
from container.models.moe import discard_router_stats, load_balancing_sum
from container.profiling import StepProfiler
from container.progress import ProgressWriter
from container.resilience import attempt, inject, step_watch
from container.resilience.ledger import CHECKPOINT, DATA, VALIDATION, TimeLedger
from container.resilience.nonfinite import NonFiniteGuard
from container.run_data import describe_data
from container.trackers.sink import STOPPED
from launcher.wire.training import flops
from launcher.wire.training.lora import LoraSettings
from launcher.wire.training.models import ModelSpec
from launcher.wire.training.resume import global_batch
from launcher.wire.training.run_settings import RunSettings

log = logging.getLogger("smlaunch")


def forward_backward(rt: Runtime, model: Transformer, micro: list[dict], s: RunSettings, spec: ModelSpec,
                     total_tokens: torch.Tensor, global_sequences: int,
                     step: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward and backward of this rank's micro-batches, gradients accumulating; returns the
    summed token loss and, for an MoE model, the summed per-sequence load-balancing loss, which
    joins the objective as a mean over the step's sequences (docs/moe.md)."""
    loss_sum = torch.zeros((), device=rt.device)
    aux_sum = torch.zeros((), device=rt.device) if spec.is_moe else None
    cp_group = rt.mesh["cp"].get_group() if rt.layout.cp > 1 else None
    for batch in micro:
        with loss_context(rt.layout.tp):
            loss, _ = token_loss_sum(model, batch, s.loss_chunk_tokens)
            loss = inject.poison(step, loss)  # tests only: before backward, so the gradients are non-finite too
            objective = loss / total_tokens
            if aux_sum is not None:
                aux = load_balancing_sum(model, cp_group)
                objective = objective + spec.router_aux_loss_coef * aux / global_sequences
                aux_sum += aux.detach()
            objective.backward()
        if aux_sum is not None:
            discard_router_stats(model)  # a checkpointed backward's recomputation set them again
        loss_sum += loss.detach()
    return loss_sum, aux_sum


def train_step(rt: Runtime, model: Transformer, pipe, optimizer, scheduler, micro: list[dict], s: RunSettings,
               spec: ModelSpec, global_sequences: int, step: int = 0, guard=None):
    """One optimizer step over this rank's micro-batches (already on the device): forward and
    backward (or the pipeline schedule), clipping, the update, FP8 scales, the schedule.
    `guard(step, loss, grad_norm)` says whether the update applies (a non-finite step's may not:
    container.resilience.nonfinite); without one it always does. Returns (the step's loss over the
    global tokens, MoE load-balancing sum or None, the step's global label tokens, gradient norm),
    all tensors."""
    local_tokens = sum(label_tokens(b["labels"]) for b in micro)
    total_tokens = _all_sum(local_tokens.to(torch.float32), rt.loss_group)
    if pipe is not None:  # the schedule runs every micro-batch's forward and backward
        loss_sum, aux_sum = pipe.step(micro, inject.poison(step, total_tokens)), None
    else:
        loss_sum, aux_sum = forward_backward(rt, model, micro, s, spec, total_tokens, global_sequences, step)
    grad_norm = optim.clip_grad_norm_(model.parameters(), s.grad_clip, pp_group=rt.pp_group)
    loss = _all_sum(loss_sum, rt.loss_group) / total_tokens
    if guard is None or guard(step, loss, grad_norm):
        optimizer.step()
        precompute_fp8_scales(model, s.fp8)
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, aux_sum, total_tokens, grad_norm


def _all_sum(value: torch.Tensor, group) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(value, group=group)
    return value


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@dataclass
class Run:
    """What the training loop steps: the run's parts, built by container.trainer."""

    rt: Runtime
    s: RunSettings
    spec: ModelSpec
    dirs: Directories
    sources: pretrained.Sources
    metrics: MetricsWriter
    model: Transformer
    pipe: Any  # this rank's pipeline schedule, or None
    optimizer: Any
    scheduler: Any
    loader: Any
    validation: data.ValidationLoader | None
    cp_shard: Callable
    checkpointer: ckpt.Checkpointer | None
    guard: NonFiniteGuard
    start_step: int  # the step the run resumes after (0: from the start)
    lora: LoraSettings | None = None  # the adapters trained on a frozen base, or None: the whole model


class _Meters(NamedTuple):
    """What the loop measures across steps, each started with the loop."""

    progress: ProgressWriter
    ledger: TimeLedger  # where the loop's time goes, for goodput
    throughput: Throughput
    compiles: CompileCount
    profiler: StepProfiler
    snapshots: MemorySnapshots


class _Step(NamedTuple):
    """What one step gives its record: tensors the loop reads only where a record or a checkpoint takes them."""

    loss: torch.Tensor
    aux_sum: torch.Tensor | None
    grad_norm: torch.Tensor
    elapsed: float
    flops_token: float  # its useful FLOPs per token


def run_steps(run: Run, profile_steps: str | None, instance_type: str | None,
              memory_snapshot_steps: str | None = None) -> dict:
    """The steps from the resumed one to max_steps, each with its record, validation and checkpoint;
    then the last checkpoint and the model's export, or, at a SIGTERM, a checkpoint and a stop."""
    rt, s, dirs = run.rt, run.s, run.dirs
    stop_flag = sigterm.install_sigterm_flag()
    attempt.started(run.start_step, dirs.output_data if rt.is_main else None)
    if rt.is_main and (event := attempt.restart_event(dirs.output_data, run.start_step)):
        run.metrics.write(event)  # the trackers see the restart at the step it resumed from
    meters = _Meters(ProgressWriter(rt.is_main, dirs.output_data, s.max_steps, run.start_step),
                     TimeLedger(run.start_step), Throughput(rt, s, run.spec, instance_type, run.start_step),
                     CompileCount(s.compile), StepProfiler(profile_steps, dirs.output_data, rt.rank, rt.device),
                     MemorySnapshots(memory_snapshot_steps, dirs.output_data, rt.rank, rt.device))
    last = {}
    for step in range(run.start_step + 1, s.max_steps + 1):
        done = _train_one(run, meters, step)
        last = _record(run, meters, step, done) or last
        if run.validation is not None and step % s.validation_freq == 0:
            # timed on its own, not as part of the step
            with meters.ledger.timing(VALIDATION), step_watch.section("validation"):
                run.metrics.write({"step": step, "val_loss": validate(rt, run.model, run.validation, s, run.cp_shard)})
        attempt.completed(step)
        step_watch.step_done(step)
        stopping = sigterm.should_stop(stop_flag)
        if run.checkpointer and (step % s.checkpoint_freq == 0 or stopping):
            _save(run, meters, step, done.loss, stopping)
        if stopping:
            meters.profiler.close()
            meters.snapshots.close()
            if rt.is_main:
                log.warning("SIGTERM: saved a checkpoint at step %d and stopping", step)
            step_watch.stop()
            run.metrics.close(STOPPED)
            return last
    _finish(run, meters)
    return last


def _train_one(run: Run, meters: _Meters, step: int) -> _Step:
    """One step: its batches (past those a rollback skips), forward, backward and the update, timed."""
    rt, s = run.rt, run.s
    _sync(rt)
    inject.at_step(step)  # tests only: a fault SMLAUNCH_FAULT_INJECTION names
    meters.profiler.before(step)
    meters.snapshots.before(step)
    t0 = time.perf_counter()
    run.guard.before_step(run.loader)  # past the batches a rollback skips
    with meters.ledger.timing(DATA):
        batches = [run.loader.next_batch() for _ in range(s.grad_accum)]
    if step == run.start_step + 1:
        describe_data(rt, run.loader.source, s)
        if rt.is_main and run.validation is not None and isinstance(run.validation.source, ChatSource):
            log.info("data: %s", run.validation.source.describe())
    # the step's useful FLOPs per token: document masking leaves only each document's attention
    # (this rank's rows stand for every rank's: they are drawn alike)
    flops_token = flops.flops_per_token(run.spec, sum(attended_length(b, s.seq_len) for b in batches) / len(batches))
    micro = [_to(run.cp_shard(batch), rt.device) for batch in batches]
    try:
        loss, aux_sum, _, grad_norm = train_step(rt, run.model, run.pipe, run.optimizer, run.scheduler, micro, s,
                                                 run.spec, global_batch(s, rt.dp_size), step, run.guard)
    except torch.OutOfMemoryError:
        meters.snapshots.out_of_memory(step)  # the recorded history up to it, then the error as it was
        raise
    # the loss is read (a host sync) only where a record or a checkpoint takes it
    _sync(rt)
    if s.clean_cache and rt.device.type == "cuda":
        torch.cuda.empty_cache()
    elapsed = time.perf_counter() - t0
    meters.ledger.step(elapsed)
    meters.compiles.step_done()
    meters.profiler.after(step)  # outside the step's time: the window's last step writes the profile
    meters.snapshots.after(step)  # and the memory snapshot
    meters.throughput.step(step, elapsed, flops_token)
    return _Step(loss, aux_sum, grad_norm, elapsed, flops_token)


def _record(run: Run, meters: _Meters, step: int, done: _Step) -> dict | None:
    """The step's record, written where it is one (a logged step, the last, or a skipped step's count);
    a logged step's is returned, and also rewrites progress.json."""
    rt, guard = run.rt, run.guard
    if guard.skipped_now(step):  # its loss is not a record's: the count is
        run.metrics.write({"step": step, **guard.fields()})
        return None
    if step % run.s.logging_freq and step != run.s.max_steps:
        return None
    record = meters.throughput.record(step, done.loss.item(), float(done.grad_norm),
                                      run.scheduler.get_last_lr()[0], done.elapsed, done.flops_token)
    if done.aux_sum is not None:  # `loss` stays the token loss, comparable with val_loss and dense models
        record["aux_loss"] = (_all_sum(done.aux_sum, rt.loss_group) / global_batch(run.s, rt.dp_size)).item()
    record.update(meters.progress.fields(step), **meters.ledger.fields(), **guard.fields(), **attempt.fields(),
                  **meters.compiles.fields())
    run.metrics.write(record)
    meters.progress.write(record)
    return record


def _save(run: Run, meters: _Meters, step: int, loss: torch.Tensor, stopping: bool) -> None:
    with meters.ledger.timing(CHECKPOINT), step_watch.section("checkpoint save"):
        run.checkpointer.save(step, run.model, run.optimizer, run.scheduler, run.loader.state_dict(),
                              {"loss": loss.item(), **run.guard.checkpoint_extra()})
        if stopping:  # an asynchronous save is on disk and committed before the process ends
            run.checkpointer.close()


def _finish(run: Run, meters: _Meters) -> None:
    """The end of max_steps: the last checkpoint committed and the model exported."""
    meters.compiles.log()
    meters.profiler.close()  # a window the run ended inside is written (the rules keep windows within max_steps)
    meters.snapshots.close()
    with step_watch.section("the last checkpoint and the model export"):
        if run.checkpointer:
            run.checkpointer.close()
        dtype = torch.bfloat16 if run.s.bf16 else torch.float32
        if run.lora is None:
            hf.export_hf(run.model, run.spec, run.dirs.model, dtype=dtype, pp_group=run.rt.pp_group)
        else:  # the adapter, and the merged model where the job asks for it
            export_lora(run.model, run.spec, run.lora, run.dirs.model, dtype, _hub_id(run.sources))
        if run.rt.is_main:
            _complete_artifact(run.sources, run.dirs.model)
            if run.lora is not None and run.lora.merge:
                _complete_artifact(run.sources, run.dirs.model / MERGED)
    step_watch.stop()
    run.metrics.close()


def _hub_id(sources: pretrained.Sources) -> str | None:
    """The base model an adapter names (adapter_config.json's base_model_name_or_path): a Hub id; None
    for a directory or a channel, which mean nothing where the adapter is loaded."""
    model = sources.model
    return model.source.repo_id if model is not None and model.source.kind == "hub" else None


def _complete_artifact(sources: pretrained.Sources, model_dir: Path) -> None:
    """The pretrained model's own generation_config.json (sampling defaults included) and the
    tokenizer, so transformers loads model.tar.gz's contents as a model and its tokenizer."""
    if sources.model is not None and (sources.model.directory / "generation_config.json").is_file():
        shutil.copyfile(sources.model.directory / "generation_config.json", model_dir / "generation_config.json")
    if sources.tokenizer is not None:
        copied = pretrained.copy_tokenizer(sources.tokenizer, model_dir)
        log.info("tokenizer of %s: %s", sources.tokenizer.source.describe(), ", ".join(copied))


@torch.no_grad()
def validate(rt: Runtime, model: Transformer, loader: data.ValidationLoader, s: RunSettings, cp_shard) -> float:
    """The validation loss, in eval mode (LoRA's dropout off), training mode again after."""
    loss_sum = torch.zeros((), device=rt.device)
    tokens = torch.zeros((), device=rt.device)
    model.eval()
    try:
        for batch in loader:
            with loss_context(rt.layout.tp):
                loss, n = token_loss_sum(model, _to(cp_shard(batch), rt.device), s.loss_chunk_tokens)
            loss_sum += loss
            tokens += n
    finally:
        model.train()
    return (_all_sum(loss_sum, rt.loss_group) / _all_sum(tokens, rt.loss_group)).item()


def _sync(rt: Runtime) -> None:
    if rt.device.type == "cuda":
        torch.cuda.synchronize(rt.device)
