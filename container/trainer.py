"""The training job behind entrypoints/train.py: what the job asks checked before anything is built,
then the run's parts built (the data, the model parallelized, the optimizer, the resumed checkpoint)
and handed to the training loop (container.loop: train, checkpoint, export)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from container import holdings, optim
from container.args import Directories, channels
from container.checkpoint import checkpointer as ckpt
from container.checkpoint import hf_export as hf
from container.checkpoint import pretrained
from container.checkpoint.saved_shape import saved_vocab_rows
from container.data import loader as data
from container.data.chat import ChatTokenizer
from container.distributed.compile import apply_compile
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
from container.distributed.tensor_parallel import apply_tp
from container.fp8 import activation_checkpoint_fn, apply_fp8
from container.loop import Run, run_steps
from container.metrics import MetricsWriter
from container.models import attention, document_kernels, qlora
from container.models.llama import Transformer, build_model
from container.models.lora import adapter_names, apply_lora
from container.resilience import step_watch
from container.resilience.nonfinite import nonfinite_guard
from container.run_data import chat_tokenizer, check_tokenizer, stream_record
from container.trackers import open_trackers
from launcher.wire.training import aws_arguments, shrink
from launcher.wire.training.data_order import mixture_issues
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.lora import LoraSettings, lora_issues, lora_settings, model_lora_issues
from launcher.wire.training.lora import describe as describe_lora
from launcher.wire.training.models import ModelSpec, vocab_rows
from launcher.wire.training.nonfinite import nonfinite_issues
from launcher.wire.training.resume import RunIdentity
from launcher.wire.training.run_settings import RunSettings, run_settings
from launcher.wire.training.speed_rules import compile_issues, speed_issues
from launcher.wire.training.tracker_rules import tracker_issues

log = logging.getLogger("smlaunch")


def settings(rt: Runtime, hp: TrainingHyperparameters) -> RunSettings:
    """What this run does: decided by launcher.wire.training.run_settings, which the planner sizes too;
    after a shrink, with the accumulation that keeps the original world's global batch
    (launcher.wire.training.shrink; init_runtime refused a shrink that cannot keep it)."""
    s = run_settings(hp, rt.params, rt.world_size)
    original = shrink.original_world(os.environ)
    if original is None or original == rt.world_size:
        return s
    accum = shrink.kept_accumulation(s.grad_accum, rt.params, original, rt.world_size)
    if rt.is_main:
        log.info("the job shrank from %d to %d ranks: gradient_accumulation_steps %d -> %d keeps its global batch",
                 original, rt.world_size, s.grad_accum, accum)
    return replace(s, grad_accum=accum)


def build_parallel_model(rt: Runtime, spec: ModelSpec, s: RunSettings, sources: pretrained.Sources | None = None,
                         vocab_rows: int | None = None, lora: LoraSettings | None = None) -> Transformer:
    """Model -> LoRA adapters -> FP8 -> tensor parallel -> activation checkpointing -> compile -> FSDP -> weights
    (delayed init, or eager init before sharding; then the pretrained weights, when the job names them).
    QLoRA's base is loaded and quantized before it is sharded (container.models.qlora)."""
    check_moe_layout(rt.params, spec.num_experts)

    def built(device) -> Transformer:
        return build_adapted_model(spec, s, device, vocab_rows, lora)

    model = built("meta" if s.delayed_init else rt.device)
    if not s.delayed_init:  # seeded right before init_weights, as the delayed path does on rank 0
        torch.manual_seed(s.seed)
        model.init_weights()
    nf4 = lora is not None and lora.nf4
    if nf4:  # eager init only (lora_issues): the whole base loaded, then quantized, then sharded
        load_weights(rt, model, sources)
        quantize_base(rt, model, s)
    parallelize(rt, model, s)
    if s.delayed_init:
        materialize_on_rank0_init(model, lambda: built("cpu"), rt.device, s.seed)
    if not nf4:
        load_weights(rt, model, sources)
    if rt.is_main:
        origin = f"weights of {sources.model.describe()}" if sources and sources.load_weights else (
            f"random weights (seed {s.seed})")
        log.info("model %s: %s parameters, %s", spec.name, f"{model.num_params(exclude_embedding=False):,}", origin)
        if lora is not None:
            log.info("%s; the base is frozen", describe_lora(spec, lora))
    return model


def load_weights(rt: Runtime, model: Transformer, sources: pretrained.Sources | None) -> None:
    """The pretrained base's weights, when the job names them; the adapters keep their initial values."""
    if sources is not None and sources.load_weights:
        hf.load_hf_weights(model, sources.model.directory, distributed=rt.world_size > 1,
                           exclude=adapter_names(model))


def quantize_base(rt: Runtime, model: Transformer, s: RunSettings) -> None:
    """QLoRA: the base's linear layers in NF4, each in whole blocks of scales per FSDP shard."""
    qlora.quantize_base(model, rt.layout.sharding_group if s.fsdp else 1)


def build_adapted_model(spec: ModelSpec, s: RunSettings, device, vocab_rows: int | None = None,
                        lora: LoraSettings | None = None) -> Transformer:
    """The model, with LoRA's adapters when the job trains them: before any wrapping, so FSDP shards
    them with their block."""
    model = build_model(spec, s.seq_len, device=device, vocab_rows=vocab_rows)
    if lora is not None:
        apply_lora(model, lora, s.seed)
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


def build_optimization(model: Transformer, s: RunSettings):
    """The optimizer and its learning-rate schedule, as the run's settings say."""
    optimizer = optim.build_optimizer(model, lr=s.lr, weight_decay=s.weight_decay, betas=s.betas, kind=s.optimizer,
                                      implementation=s.optimizer_implementation)
    scheduler = optim.lr_schedule(optimizer, warmup_steps=s.warmup_steps, total_steps=s.decay_steps,
                                  min_lr=s.min_lr, style=s.lr_style)
    return optimizer, scheduler


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


def refuse_unimplemented(hp: TrainingHyperparameters, params: ModelParallelParameters | None = None) -> None:
    """AWS's script's arguments that this runtime does not do, trackers' settings that would do
    nothing, a data_mixture the loader cannot read, the speed settings this GPU or library cannot
    run, what compile cannot compile and what LoRA does not compose with (`params`: the job's
    degrees, all 1 if not given) fail the job before anything is built, with validation's words
    (launcher.wire.training.aws_arguments, tracker_rules, data_order, speed_rules, lora); QLoRA
    without torchao exits 2, naming the extra that installs it."""
    problems = (aws_arguments.runtime_issues(hp) + tracker_issues(hp) + mixture_issues(hp) + nonfinite_issues(hp)
                + speed_issues(hp) + compile_issues(hp))
    lora_problems = lora_issues(hp, params or ModelParallelParameters())
    for warning in (i for i in lora_problems if i.level == "warning"):  # a LoRA setting without use_peft
        log.warning("%s", warning)
    _refuse(problems + [i for i in lora_problems if i.level == "error"])
    if hp.use_peft and hp.load_in_4bit:
        qlora.require_torchao()


def _refuse(problems: list) -> None:
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
    refuse_unimplemented(hp, rt.params)
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
    lora = adapters(hp, spec)
    # the data before the model: a bad record or tokenizer fails the job before weights are loaded
    loader, validation = build_data(rt, dirs, s, spec, sources, vocab_size_given=hp.vocab_size is not None)
    rows = model_vocab_rows(rt, spec, s, dirs)
    if rt.layout.pp > 1:  # this rank's stages; the pipeline runs forward and backward
        model, pipe = build_pipeline(rt, spec, s, parallelize, pretrained_weights=sources.load_weights,
                                     vocab_rows=rows)
    else:
        model, pipe = build_parallel_model(rt, spec, s, sources, rows, lora), None
    cp_shard = apply_context_parallel(rt, s.cp_comm_type)  # cuts each micro-batch for this cp rank
    optimizer, scheduler = build_optimization(model, s)
    holdings.log_after_first_step(rt.rank, model, optimizer)  # to compare with `smlaunch plan --trace`
    identity = RunIdentity(s, spec, rt.dp_size, rows, lora, base_identity(rt, s, sources, lora))
    checkpointer = ckpt.Checkpointer(dirs.checkpoints, keep=s.keep_checkpoints, identity=identity,
                                     async_mode=s.checkpoint_async_mode, timeout=rt.collective_timeout,
                                     streams=stream_record(loader.source, s, dirs)) if s.checkpoint_freq else None
    start_step, extra = resume(rt, dirs, checkpointer, model, optimizer, scheduler, loader)
    guard = nonfinite_guard(s, rt.rank, rt.local_rank, rt.device, dirs.checkpoints if checkpointer else None, extra)
    run = Run(rt, s, spec, dirs, sources, metrics, model, pipe, optimizer, scheduler, loader, validation, cp_shard,
               checkpointer, guard, start_step, lora)
    return run_steps(run, hp.profile_steps, instance_type, hp.memory_snapshot_steps)


def adapters(hp: TrainingHyperparameters, spec: ModelSpec) -> LoraSettings | None:
    """The LoRA adapters the job trains on its model, or None; targets the model lacks fail the job."""
    _refuse(model_lora_issues(hp, spec))
    return lora_settings(hp, spec)


def base_identity(rt: Runtime, s: RunSettings, sources: pretrained.Sources, lora: LoraSettings | None) -> dict | None:
    """What a LoRA run's checkpoints record of the base its adapters train on (a resume on another is
    refused); None without checkpoints, or for a run that trains the whole model (its checkpoints hold it)."""
    return pretrained.base_identity(sources, rt.rank, s.seed) if lora is not None and s.checkpoint_freq else None


def build_data(rt: Runtime, dirs: Directories, s: RunSettings, spec: ModelSpec, sources: pretrained.Sources, *,
               vocab_size_given: bool):
    """The training data's loader, its tokenizer checked against the model's, and the validation loader."""
    tokenizer = chat_tokenizer(s, sources)
    loader = data.build_dataloader(
        dataset_type=s.dataset_type, path=dirs.train, seq_len=s.seq_len, micro_batch_size=s.micro_batch,
        dp_rank=rt.dp_rank, dp_size=rt.dp_size, grad_accum=s.grad_accum, vocab_size=spec.vocab_size, seed=s.seed,
        document_masking=s.document_masking, shuffle=s.shuffle, mixture=s.data_mixture, channels=channels(),
        tokenizer=tokenizer, truncation_mode=s.truncation_mode)
    check_tokenizer(loader.source, sources, vocab_size_given)
    return loader, validation_loader(rt, dirs, s, spec, tokenizer)


def resume(rt: Runtime, dirs: Directories, checkpointer: ckpt.Checkpointer | None, model, optimizer, scheduler,
           loader) -> tuple[int, dict | None]:
    """(the step the run resumes after, the resumed checkpoint's extra state): the newest checkpoint's,
    loaded into the model, optimizer, schedule and data loader; (0, None) without one."""
    if checkpointer is None:
        return 0, None
    loading = time.perf_counter()
    restored = checkpointer.load_latest(model, optimizer, scheduler)
    if restored is None:
        return 0, None
    start_step, loader_state, extra = restored
    loader.load_state_dict(loader_state)
    if rt.is_main:  # the load's share of a restart (bench/recovery.py reads it)
        log.info("resumed from step %d in %s (verified and loaded in %.2f s)", start_step, dirs.checkpoints,
                 time.perf_counter() - loading)
    return start_step, extra


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

