"""The training loop behind entrypoints/train.py: build, parallelize, train, checkpoint, export.

Loss normalisation: every rank's loss is its summed token loss over the *global* token count of
the step (all micro-batches, all data-parallel and context-parallel ranks); gradients are summed
(parallelize.py). So loss and gradients are those of one process seeing the whole global batch.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from container import optim
from container.args import Directories, channels
from container.checkpoint import checkpointer as ckpt
from container.checkpoint import hf_export as hf
from container.checkpoint import pretrained, sigterm
from container.checkpoint.saved_shape import saved_vocab_rows
from container.data import loader as data
from container.data.chat import ChatTokenizer
from container.data.chat_source import ChatSource
from container.data.rows import attended_length
from container.distributed.compile import CompileCount, apply_compile
from container.distributed.context_parallel import apply_context_parallel
from container.distributed.expert_parallel import apply_expert_parallel, check_moe_layout, expert_meshes
from container.distributed.offload import ActivationOffloader
from container.distributed.parallelize import (
    apply_activation_checkpointing,
    apply_fsdp,
    materialize_on_rank0_init,
)
from container.distributed.pipeline import build_pipeline
from container.distributed.runtime import Runtime
from container.distributed.tensor_parallel import apply_tp, loss_context
from container.fp8 import activation_checkpoint_fn, apply_fp8, precompute_fp8_scales
from container.loss import label_tokens, token_loss_sum
from container.metrics import MetricsWriter, step_record
from container.models import attention, document_kernels
from container.models.llama import Transformer, build_model
from container.models.moe import load_balancing_sum
from container.profiling import StepProfiler
from container.progress import ProgressWriter
from container.resilience import attempt, inject, step_watch
from container.resilience.ledger import CHECKPOINT, DATA, VALIDATION, TimeLedger
from container.resilience.nonfinite import nonfinite_guard
from container.run_data import chat_tokenizer, check_tokenizer, describe_data, stream_record
from container.trackers import open_trackers
from container.trackers.sink import STOPPED
from launcher.wire.training import aws_arguments, flops
from launcher.wire.training.compile_rules import compile_issues
from launcher.wire.training.data_order import mixture_issues
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.models import ModelSpec, vocab_rows
from launcher.wire.training.nonfinite_rules import nonfinite_issues
from launcher.wire.training.resume import RunIdentity
from launcher.wire.training.run_settings import RunSettings, run_settings
from launcher.wire.training.speed_rules import speed_issues
from launcher.wire.training.tracker_rules import tracker_issues

log = logging.getLogger("smlaunch")


def settings(rt: Runtime, hp: TrainingHyperparameters) -> RunSettings:
    """What this run does: decided by launcher.wire.training.run_settings, which the planner sizes too."""
    return run_settings(hp, rt.params, rt.world_size)


def build_parallel_model(rt: Runtime, spec: ModelSpec, s: RunSettings,
                         sources: pretrained.Sources | None = None, vocab_rows: int | None = None) -> Transformer:
    """Model -> FP8 -> tensor parallel -> activation checkpointing -> compile -> FSDP -> weights (delayed init,
    or eager init before sharding; then the pretrained weights, when the job names them)."""
    check_moe_layout(rt.params, spec.num_experts)
    model = build_model(spec, s.seq_len, device="meta" if s.delayed_init else rt.device, vocab_rows=vocab_rows)
    if not s.delayed_init:  # seeded right before init_weights, as the delayed path does on rank 0
        torch.manual_seed(s.seed)
        model.init_weights()
    parallelize(rt, model, s)
    if s.delayed_init:
        materialize_on_rank0_init(model, lambda: build_model(spec, s.seq_len, device="cpu", vocab_rows=vocab_rows),
                                  rt.device, s.seed)
    if sources is not None and sources.load_weights:
        hf.load_hf_weights(model, sources.model.directory, distributed=rt.world_size > 1)
    if rt.is_main:
        origin = f"weights of {sources.model.describe()}" if sources and sources.load_weights else (
            f"random weights (seed {s.seed})")
        log.info("model %s: %s parameters, %s", spec.name, f"{model.num_params(exclude_embedding=False):,}", origin)
    return model


def parallelize(rt: Runtime, model: Transformer, s: RunSettings) -> None:
    """FP8 -> tensor parallel -> activation checkpointing -> compile -> FSDP, on the whole model or on one
    pipeline stage of it (container.distributed.pipeline)."""
    if s.fp8.enabled:  # first: tensor parallelism, checkpointing and FSDP wrap the swapped projections
        apply_fp8(model, s.fp8, rt)
    if rt.layout.tp > 1:
        apply_tp(model, rt.mesh["tp"])
    expert_mesh = None
    if rt.layout.ep > 1:  # before checkpointing and FSDP, which wrap the dispatching experts
        ep_mesh, expert_mesh = expert_meshes(rt)
        apply_expert_parallel(model, ep_mesh)
    if s.ac_mode:
        offloader = ActivationOffloader(s.offload_horizon, rt.device) if s.offload else None
        apply_activation_checkpointing(model, s.ac_mode, offloader,
                                       checkpoint_fn=activation_checkpoint_fn(s.fp8, s.ac_mode), freq=s.ac_freq)
    if s.compile:  # after checkpointing, before FSDP (container.distributed.compile says why)
        apply_compile(model, rt.layout.tp)
    if s.fsdp:
        apply_fsdp(model, rt.fsdp_mesh, param_dtype=torch.bfloat16 if s.bf16 else None,
                   reshard_after_forward=s.reshard_after_forward, wrap_policy=s.wrap_policy,
                   min_num_params=s.min_num_params, persistence_threshold=s.persistence_threshold,
                   max_live_parameters=s.max_live_parameters, expert_mesh=expert_mesh)


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
        loss_sum += loss.detach()
    return loss_sum, aux_sum


def build_optimization(model: Transformer, s: RunSettings):
    """The optimizer and its learning-rate schedule, as the run's settings say."""
    optimizer = optim.build_optimizer(model, lr=s.lr, weight_decay=s.weight_decay, betas=s.betas, kind=s.optimizer,
                                      implementation=s.optimizer_implementation)
    scheduler = optim.lr_schedule(optimizer, warmup_steps=s.warmup_steps, total_steps=s.decay_steps,
                                  min_lr=s.min_lr, style=s.lr_style)
    return optimizer, scheduler


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


def check_writable(directories: dict[str, Path]) -> None:
    """Create (if need be) each directory and a probe file in it, then delete the probe: a
    directory training cannot write fails the job now, not after hours of training.

    The probe's name is mkstemp's, not the process id: hosts share model_dir and checkpoint_dir
    (local mode's containers, an FSx or EFS mount), and in containers their ranks have the same
    pids, so one host deleted the probe another was about to delete (ENOENT: "not writable")."""
    for label, directory in directories.items():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=".smlaunch-write-probe-", dir=directory)
            os.close(handle)
            os.unlink(probe)
        except OSError as exc:
            raise PermissionError(
                f"{label} {directory} is not writable ({exc.strerror or exc}): make it writable, "
                f"or point {label} at a directory this job can write") from exc


def refuse_unimplemented(hp: TrainingHyperparameters) -> None:
    """AWS's script's arguments that this runtime does not do, trackers' settings that would do
    nothing, a data_mixture the loader cannot read, the speed settings this GPU or library cannot
    run and what compile cannot compile fail the job before anything is built, with validation's
    words (launcher.wire.training.aws_arguments, tracker_rules, data_order, speed_rules, compile_rules)."""
    problems = (aws_arguments.runtime_issues(hp) + tracker_issues(hp) + mixture_issues(hp) + nonfinite_issues(hp)
                + speed_issues(hp) + compile_issues(hp))
    if problems:
        raise ValueError("; ".join(map(str, problems)) + " (run `smlaunch validate` on the job for the full list)")


def model_vocab_rows(rt: Runtime, spec: ModelSpec, s: RunSettings, dirs: Directories) -> int:
    """The embedding's and head's rows: the vocabulary, padded where tensor parallelism cannot
    split it, or the rows of the checkpoint this run resumes where it can (container.checkpoint.saved_shape)."""
    saved = saved_vocab_rows(dirs.checkpoints) if s.checkpoint_freq else None
    rows = vocab_rows(spec.vocab_size, rt.layout.tp, saved)
    if rows != spec.vocab_size and rt.is_main:
        log.info("vocabulary: %d entries in %d rows (%s); the padding's logits are masked, the exported model "
                 "has %d", spec.vocab_size, rows, "the checkpoint's" if rows == saved else
                 f"tensor_parallel_degree {rt.layout.tp} does not split {spec.vocab_size}", spec.vocab_size)
    return rows


def train(rt: Runtime, hp: TrainingHyperparameters, dirs: Directories, instance_type: str | None = None) -> dict:
    refuse_unimplemented(hp)
    s = settings(rt, hp)
    # first: a kernel this device cannot run fails the job before anything is built or read
    attention.use_kernel(document_kernels.build(s.attention_kernel, rt.device, s.bf16))
    writable = {"model_dir": dirs.model, "output_data_dir": dirs.output_data}
    if dirs.tensorboard is not None:
        writable["tensorboard_dir"] = dirs.tensorboard
    check_writable({**writable, "checkpoint_dir": dirs.checkpoints} if s.checkpoint_freq else writable)
    # now: a missing tensorboard, or a required tracker that cannot start, fails the job before training
    trackers = open_trackers(hp, rt.world_size, instance_type,
                             dirs.checkpoints if s.checkpoint_freq else None) if rt.is_main else []
    metrics = MetricsWriter(rt, dirs.output_data, dirs.tensorboard, trackers)
    try:
        return _train(rt, hp, dirs, s, metrics, instance_type)
    except BaseException:
        step_watch.stop()  # a failing rank leaves with its own error, not the watchdog's
        metrics.fail()  # the trackers' runs say the job failed, not running for ever
        raise


def _train(rt: Runtime, hp: TrainingHyperparameters, dirs: Directories, s: RunSettings, metrics: MetricsWriter,
           instance_type: str | None) -> dict:
    sources = pretrained.prepare(hp, rt.rank, rt.local_rank, rt.world_size)
    step_watch.start(hp, dirs.output_data)  # after a Hub download, which has its own bound
    spec = pretrained.model_spec(hp, sources)
    # the data before the model: a bad record or tokenizer fails the job before weights are loaded
    tokenizer = chat_tokenizer(s, sources)
    loader = data.build_dataloader(
        dataset_type=s.dataset_type, path=dirs.train, seq_len=s.seq_len, micro_batch_size=s.micro_batch,
        dp_rank=rt.dp_rank, dp_size=rt.dp_size, grad_accum=s.grad_accum, vocab_size=spec.vocab_size, seed=s.seed,
        document_masking=s.document_masking, shuffle=s.shuffle, mixture=s.data_mixture, channels=channels(),
        tokenizer=tokenizer, truncation_mode=s.truncation_mode)
    check_tokenizer(loader.source, sources)
    validation = validation_loader(rt, dirs, s, spec, tokenizer)
    rows = model_vocab_rows(rt, spec, s, dirs)
    if rt.layout.pp > 1:  # this rank's stages; the pipeline runs forward and backward
        model, pipe = build_pipeline(rt, spec, s, parallelize, pretrained_weights=sources.load_weights,
                                     vocab_rows=rows)
    else:
        model, pipe = build_parallel_model(rt, spec, s, sources, rows), None
    cp_shard = apply_context_parallel(rt, s.cp_comm_type)  # cuts each micro-batch for this cp rank
    optimizer, scheduler = build_optimization(model, s)
    checkpointer = ckpt.Checkpointer(dirs.checkpoints, keep=s.keep_checkpoints,
                                     identity=RunIdentity(s, spec, rt.dp_size, rows),
                                     async_mode=s.checkpoint_async_mode, timeout=rt.collective_timeout,
                                     streams=stream_record(loader.source, s, dirs)) if s.checkpoint_freq else None
    start_step, extra = 0, None
    if checkpointer is not None:
        loading = time.perf_counter()
        restored = checkpointer.load_latest(model, optimizer, scheduler)
        if restored is not None:
            start_step, loader_state, extra = restored
            loader.load_state_dict(loader_state)
            if rt.is_main:  # the load's share of a restart (bench/recovery.py reads it)
                log.info("resumed from step %d in %s (verified and loaded in %.2f s)", start_step, dirs.checkpoints,
                         time.perf_counter() - loading)
    guard = nonfinite_guard(s, rt.rank, rt.local_rank, rt.device, dirs.checkpoints if checkpointer else None, extra)
    stop_flag = sigterm.install_sigterm_flag()
    attempt.started(start_step, dirs.output_data if rt.is_main else None)
    if rt.is_main and (event := attempt.restart_event(dirs.output_data, start_step)):
        metrics.write(event)  # the trackers see the restart at the step it resumed from
    progress = ProgressWriter(rt.is_main, dirs.output_data, s.max_steps, start_step)
    ledger = TimeLedger(start_step)  # where the loop's time goes, for goodput
    seed_flops_token = flops.seed_flops_per_token(spec, s.seq_len)
    timed_flops = 0.0  # useful FLOPs of the timed steps: attention over what the documents span
    peak = flops.peak_tflops(instance_type, "fp8" if s.fp8.enabled else "bf16",
                             torch.cuda.get_device_name() if rt.device.type == "cuda" else None)
    global_tokens_per_step = s.micro_batch * s.seq_len * s.grad_accum * rt.dp_size
    global_sequences = s.micro_batch * s.grad_accum * rt.dp_size
    timed_tokens, timed_seconds, last = 0, 0.0, {}
    compiles = CompileCount(s.compile)
    profiler = StepProfiler(hp.profile_steps, dirs.output_data, rt.rank, rt.device)
    for step in range(start_step + 1, s.max_steps + 1):
        _sync(rt)
        inject.at_step(step)  # tests only: a fault SMLAUNCH_FAULT_INJECTION names
        profiler.before(step)
        t0 = time.perf_counter()
        guard.before_step(loader)  # past the batches a rollback skips
        with ledger.timing(DATA):
            batches = [loader.next_batch() for _ in range(s.grad_accum)]
        if step == start_step + 1:
            describe_data(rt, loader.source, s)
            if rt.is_main and validation is not None and isinstance(validation.source, ChatSource):
                log.info("data: %s", validation.source.describe())
        # the step's useful FLOPs per token: document masking leaves only each document's attention
        # (this rank's rows stand for every rank's: they are drawn alike)
        step_flops_token = flops.flops_per_token(spec, sum(attended_length(b, s.seq_len) for b in batches)
                                                 / len(batches))
        micro = [_to(cp_shard(batch), rt.device) for batch in batches]
        loss, aux_sum, total_tokens, grad_norm = train_step(
            rt, model, pipe, optimizer, scheduler, micro, s, spec, global_sequences, step, guard)
        # the loss is read (a host sync) only where a record or a checkpoint takes it
        _sync(rt)
        if s.clean_cache and rt.device.type == "cuda":
            torch.cuda.empty_cache()
        elapsed = time.perf_counter() - t0
        ledger.step(elapsed)
        compiles.step_done()
        profiler.after(step)  # outside the step's time: the window's last step writes the profile
        if step > start_step + 2:  # leave out warm-up (allocator, first all-gathers)
            timed_tokens += global_tokens_per_step
            timed_seconds += elapsed
            timed_flops += global_tokens_per_step * step_flops_token
        if guard.skipped_now(step):  # its loss is not a record's: the count is
            metrics.write({"step": step, **guard.fields()})
        elif step % s.logging_freq == 0 or step == s.max_steps:
            flops_token = timed_flops / timed_tokens if timed_tokens else step_flops_token
            last = step_record(rt, step, loss.item(), float(grad_norm), scheduler.get_last_lr()[0], timed_tokens,
                           timed_seconds, global_tokens_per_step, elapsed, s, flops_token, seed_flops_token, peak)
            if aux_sum is not None:  # `loss` stays the token loss, comparable with val_loss and dense models
                last["aux_loss"] = (_all_sum(aux_sum, rt.loss_group) / global_sequences).item()
            last.update(progress.fields(step), **ledger.fields(), **guard.fields(), **attempt.fields(),
                        **compiles.fields())
            metrics.write(last)
            progress.write(last)
        if validation is not None and step % s.validation_freq == 0:
            # timed on its own, not as part of the step
            with ledger.timing(VALIDATION), step_watch.section("validation"):
                metrics.write({"step": step, "val_loss": validate(rt, model, validation, s, cp_shard)})
        attempt.completed(step)
        step_watch.step_done(step)
        stopping = sigterm.should_stop(stop_flag)
        if checkpointer and (step % s.checkpoint_freq == 0 or stopping):
            with ledger.timing(CHECKPOINT), step_watch.section("checkpoint save"):
                checkpointer.save(step, model, optimizer, scheduler, loader.state_dict(),
                                  {"loss": loss.item(), **guard.checkpoint_extra()})
                if stopping:  # an asynchronous save is on disk and committed before the process ends
                    checkpointer.close()
        if stopping:
            profiler.close()
            if rt.is_main:
                log.warning("SIGTERM: saved a checkpoint at step %d and stopping", step)
            step_watch.stop()
            metrics.close(STOPPED)
            return last
    compiles.log()
    profiler.close()  # a window the run ended inside is written (the rules keep windows within max_steps)
    with step_watch.section("the last checkpoint and the model export"):
        if checkpointer:
            checkpointer.close()
        hf.export_hf(model, spec, dirs.model, dtype=torch.bfloat16 if s.bf16 else torch.float32,
                     pp_group=rt.pp_group)
        if rt.is_main:
            _complete_artifact(sources, dirs.model)
    step_watch.stop()
    metrics.close()
    return last


def _complete_artifact(sources: pretrained.Sources, model_dir: Path) -> None:
    """The pretrained model's own generation_config.json (sampling defaults included) and the
    tokenizer, so transformers loads model.tar.gz's contents as a model and its tokenizer."""
    if sources.model is not None and (sources.model.directory / "generation_config.json").is_file():
        shutil.copyfile(sources.model.directory / "generation_config.json", model_dir / "generation_config.json")
    if sources.tokenizer is not None:
        copied = pretrained.copy_tokenizer(sources.tokenizer, model_dir)
        log.info("tokenizer of %s: %s", sources.tokenizer.source.describe(), ", ".join(copied))


def validation_loader(rt: Runtime, dirs: Directories, s: RunSettings, spec: ModelSpec,
                      tokenizer: ChatTokenizer | None) -> data.ValidationLoader | None:
    """The validation channel's loader, when the job validates; built once, before training (each
    pass reads it from its start), so its records are checked, and chat examples tokenized, once."""
    if not (s.validation_freq and dirs.validation):
        return None
    # the validation channel is records, shards or chat examples as the training data is (synthetic: records)
    return data.build_validation_loader(
        dataset_type=s.dataset_type if s.dataset_type in ("indexed", "chat") else "jsonl", path=dirs.validation,
        seq_len=s.seq_len, micro_batch_size=s.val_batch, dp_rank=rt.dp_rank, dp_size=rt.dp_size,
        vocab_size=spec.vocab_size, seed=s.seed, max_batches=s.validation_batches,
        document_masking=s.document_masking, tokenizer=tokenizer, truncation_mode=s.truncation_mode)


@torch.no_grad()
def validate(rt: Runtime, model: Transformer, loader: data.ValidationLoader, s: RunSettings, cp_shard) -> float:
    loss_sum = torch.zeros((), device=rt.device)
    tokens = torch.zeros((), device=rt.device)
    for batch in loader:
        with loss_context(rt.layout.tp):
            loss, n = token_loss_sum(model, _to(cp_shard(batch), rt.device), s.loss_chunk_tokens)
        loss_sum += loss
        tokens += n
    return (_all_sum(loss_sum, rt.loss_group) / _all_sum(tokens, rt.loss_group)).item()


def _sync(rt: Runtime) -> None:
    if rt.device.type == "cuda":
        torch.cuda.synchronize(rt.device)


