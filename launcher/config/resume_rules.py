"""The validator's note on a job that resumes from checkpoints: what a resume may change and what
it must keep (launcher.wire.training.resume decides both; the runtime enforces them at resume); and where
this machine has both the newest checkpoint and the channels (a local job's checkpoint_local_path,
local inputs), what the resume would make of data that changed since (launcher.wire.training.resume.compare)."""

from __future__ import annotations

from pathlib import Path

from launcher.config.context import Context
from launcher.config.data_rules import given_tokenizer
from launcher.config.job import DEFAULT_CHECKPOINT_PATH, JobConfig
from launcher.config.job_rules import resolve_path
from launcher.wire import checkpoints
from launcher.wire.datafiles import TRAIN_CHANNELS
from launcher.wire.training.issues import Issue
from launcher.wire.training.layout import ParallelLayout, layout_problems, with_sharding_strategy
from launcher.wire.training.resume import KEPT, batch_text, compare, data_stream, global_batch, may_change
from launcher.wire.training.run_settings import run_settings


def check_resume(ctx: Context) -> list[Issue]:
    """An info-level note when smlaunch's runtime checkpoints to a place later runs resume from."""
    where = resume_place(ctx.job)
    if where is None or not ctx.runtime or not ctx.hp.checkpoint_freq:
        return []
    s = run_settings(ctx.hp, ctx.params, ctx.world or 1)
    dp = _data_parallel(ctx)
    values = {
        "global_batch": batch_text(s, dp) if dp else None,
        "sequence_length": s.seq_len,
        "data_stream": data_stream(s),
        "model": ctx.model.name if ctx.model else None,
        "optimizer": s.optimizer,
    }
    kept = ", ".join(k.label + (f" (here {values[k.key]})" if values[k.key] is not None else "")
                     for k in KEPT if k.noted)
    fix = (f"to resume on a fleet with another data-parallel degree d, keep the global batch: train_batch_size x "
           f"gradient_accumulation_steps = {global_batch(s, dp)} / d" if dp else
           "keep train_batch_size x data-parallel degree x gradient_accumulation_steps equal")
    detail = (f"A resume may change {may_change()} (the checkpoint is resharded); it must keep the {kept}, or it "
              f"fails at resume; {fix}.")
    return [Issue(*where, "this job resumes from the newest checkpoint there: a resume may change the world size "
                  "and the parallel degrees, and must keep the global batch, sequence length, data stream, model "
                  "and optimizer", "details: smlaunch validate --verbose, docs/spot.md", "info", detail)]


def check_resume_data(ctx: Context) -> list[Issue]:
    """The newest checkpoint of a local checkpoint directory against the local channels the run
    would read: an error where the runtime would refuse to resume, a warning where it would warn."""
    where = resume_place(ctx.job)
    if where is None or where[0] != "checkpoint_local_path" or not ctx.runtime or not ctx.hp.checkpoint_freq:
        return []
    latest = checkpoints.latest_local(resolve_path(ctx.base_dir, where[1]))
    s = run_settings(ctx.hp, ctx.params, ctx.world or 1)
    inputs = _local_channels(ctx, [name for name, _ in s.data_mixture])
    try:
        saved = checkpoints.read_data_streams(Path(latest.where)) if latest is not None else None
        now = (checkpoints.data_streams(s.dataset_type, s.shuffle, {key: path for key, (_, path) in inputs.items()},
                                        tokenizer=given_tokenizer(ctx.job, ctx.base_dir))
               if saved is not None and inputs else None)
    except (OSError, ValueError):  # unreadable channels are the data rules' to report; a damaged record the runtime's
        return []
    if now is None:
        return []
    changes = compare(saved, now)
    return [Issue(f"inputs.{inputs[change.channel][0]}", str(inputs[change.channel][1]),
                  f"{change.problem} ({latest.where})", change.then, level)
            for level, found in (("error", changes.refusals), ("warning", changes.warnings)) for change in found]


def _local_channels(ctx: Context, mixture: list[str]) -> dict[str, tuple[str, Path]]:
    """The inputs the run reads, as (input name, path) keyed as the runtime records the channels,
    where all are on this machine (else none: the record could not be compared whole)."""
    channels = ctx.job.channels()
    train = next((name for name in TRAIN_CHANNELS if name in channels), None)
    wanted = {name: name for name in mixture} if mixture else ({"train": train} if train else {})
    if not wanted or any(name not in channels or channels[name].s3_data.startswith("s3://")
                         for name in wanted.values()):
        return {}
    return {key: (name, resolve_path(ctx.base_dir, channels[name].s3_data)) for key, name in wanted.items()}


def resume_place(job: JobConfig) -> tuple[str, str] | None:
    """(field, value) naming where this job's checkpoints outlive it: the S3 prefix SageMaker (or
    local mode) syncs, or a local job's own checkpoint directory, which re-runs share."""
    if job.checkpoint_s3_uri:
        return "checkpoint_s3_uri", job.checkpoint_s3_uri
    if not job.on_sagemaker and job.checkpoint_local_path not in (None, DEFAULT_CHECKPOINT_PATH):
        return "checkpoint_local_path", job.checkpoint_local_path
    return None


def _data_parallel(ctx: Context) -> int | None:
    """The job's data-parallel degree, where its world is known and its degrees tile it."""
    if ctx.world is None:
        return None
    params = with_sharding_strategy(ctx.params, ctx.hp.sharding_strategy, ctx.processes_per_host)
    if layout_problems(params, ctx.world):
        return None
    return ParallelLayout.from_parameters(params, ctx.world).data_parallel
