"""The validator's note on a job that resumes from checkpoints: what a resume may change and what
it must keep (launcher.config.resume decides both; the runtime enforces them at resume)."""

from __future__ import annotations

from launcher.config.issues import Issue
from launcher.config.job import DEFAULT_CHECKPOINT_PATH, JobConfig
from launcher.config.layout import ParallelLayout, layout_problems, with_sharding_strategy
from launcher.config.resume import KEPT, batch_text, data_stream, global_batch, may_change
from launcher.config.rules import Context
from launcher.config.run_settings import run_settings


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
