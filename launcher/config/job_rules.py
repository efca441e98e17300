"""Job-level rules: spot and stopping settings, S3 locations, files, metrics, image, hyperparameter names.

Each returns Issues; none raises, so all are reported with the parallelism rules. Files are
looked at with os.path's predicates, which answer False where pathlib's raise (a path too long,
a directory that may not be searched): the issue then says the file is not there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from launcher.config import backend_table
from launcher.config.context import Context
from launcher.config.images import ImageResolutionError, ecr_region, job_image_choice
from launcher.config.job import JobConfig
from launcher.config.rules import HP
from launcher.config.trainer_names import known_name_hint, meant_as_known
from launcher.wire.datafiles import not_data
from launcher.wire.masking import secret_values
from launcher.wire.training import aws_arguments
from launcher.wire.training.hyperparameters import DIRECTORY_ARGUMENTS, TrainingHyperparameters
from launcher.wire.training.issues import Issue, did_you_mean
from launcher.wire.training.models import PRESETS

# Imports inside functions: the runtime's requirements load only for the warning that names them
# (CLI start-up).


def check_job_fields(ctx: Context) -> list[Issue]:
    job = ctx.job
    issues = []
    for i, metric in enumerate(job.metric_definitions or []):
        if re.compile(metric.Regex).groups < 1:
            issues.append(Issue(f"metric_definitions[{i}].Regex", metric.Regex,
                                "has no capture group, so SageMaker never records a value",
                                "wrap the number in a group, e.g. 'loss=([0-9.]+)'", "warning"))
    if job.on_sagemaker:
        if job.output_path and not job.output_path.startswith("s3://"):
            issues.append(Issue("output_path", job.output_path, "SageMaker writes artifacts to S3",
                                "use s3://bucket/prefix (local paths work with instance_type: local)"))
        for name, channel in job.channels().items():
            if not channel.s3_data.startswith("s3://"):
                issues.append(Issue(f"inputs.{name}", channel.s3_data, "SageMaker reads channels from S3",
                                    "upload the data and use s3://..., or run with instance_type: local"))
    else:
        row = backend_table.named(job.backend_name)
        # on a cluster's own storage (kubernetes) the paths are not here: the backend's rules check them
        issues += ([] if row is not None and row.cluster_image else _check_local_paths(ctx)) + _secret_arguments(job)
    return issues + _check_files(ctx)


def _secret_arguments(job: JobConfig) -> list[Issue]:
    """Hyperparameters become the script's command line, which every user of this machine (local)
    or of the Slurm nodes sees in the process list (`ps -ef`, /proc/PID/cmdline): a secret among
    them (a secret-named key, a URL password) is shown there; the environment is not."""
    values = job.hyperparameters.model_dump(mode="json", exclude_none=True)
    return [Issue(f"hyperparameters.{key}", value, "is a secret, and hyperparameters are the script's command "
                  "line, which other users of this machine or of the Slurm nodes can read in the process list",
                  f"pass it in environment instead (environment: {{{key.upper()}: ...}})", "warning")
            for key, value in values.items() if secret_values({key: value})]


def _check_local_paths(ctx: Context) -> list[Issue]:
    """Local runs read channels from disk and may write artifacts to a directory."""
    job, issues = ctx.job, []
    for name, channel in job.channels().items():
        if channel.s3_data.startswith("s3://"):
            if channel.s3_data_type != "S3Prefix":
                issues.append(Issue(f"inputs.{name}.s3_data_type", channel.s3_data_type,
                                    "local mode downloads S3 prefixes only",
                                    "use s3_data_type: S3Prefix, or download the data and give a local path"))
            continue
        path = resolve_path(ctx.base_dir, channel.s3_data)
        if not os.path.exists(path):
            issues.append(Issue(f"inputs.{name}", channel.s3_data, f"no such file or directory ({path})",
                                "give a path relative to the job file that sets it, an absolute path, or s3://..."))
        elif problem := not_data(path):
            issues.append(Issue(f"inputs.{name}", channel.s3_data, f"{problem}: a channel holds regular files "
                                "and directories only", "remove it from the channel, or give another path"))
    if job.output_path and not job.output_path.startswith("s3://"):
        out = resolve_path(ctx.base_dir, job.output_path)
        if os.path.exists(out) and not os.path.isdir(out):
            issues.append(Issue("output_path", job.output_path, f"{out} is a file, not a directory",
                                "give a directory (created if missing) or s3://bucket/prefix"))
    return issues


def _check_files(ctx: Context) -> list[Issue]:
    job = ctx.job
    if job.source_dir and outside_source_dir(job.entry_point):
        return [Issue("entry_point", job.entry_point, f"must be a path inside source_dir '{job.source_dir}', "
                      "relative to it", "e.g. entry_point: train.py, or move the script into source_dir")]
    entry = entry_point_path(job, ctx.base_dir)
    if entry is None:
        return []
    issues = []
    if job.source_dir:
        src = code_dir(job, ctx.base_dir)
        if not os.path.isdir(src):
            return [Issue("source_dir", job.source_dir, f"no such directory ({src})",
                          "give a directory relative to the job file, or an absolute path")]
        where = f"in source_dir {src}"
    else:
        where = f"({entry})"
    if not os.path.isfile(entry):
        issues.append(Issue("entry_point", job.entry_point, f"file not found {where}",
                            "pass the script's path relative to source_dir (or to the job file)"))
    for i, dep in enumerate(job.dependencies):
        if not os.path.exists(resolve_path(ctx.base_dir, dep)):
            issues.append(Issue(f"dependencies[{i}]", dep, "no such file or directory",
                                "give a path relative to the job file that sets it, or an absolute path"))
    return issues


def outside_source_dir(entry_point: str) -> bool:
    """With source_dir, entry_point names a file of the archive, relative to its root: an absolute
    path or one with '..' names none (the one rule of validate, dry runs and the code archive)."""
    rel = PurePosixPath(entry_point)
    return rel.is_absolute() or ".." in rel.parts


def code_dir(job: JobConfig, base: Path) -> Path | None:
    """The local directory whose files the job ships as its code (the script's working directory
    in the container); None when source_dir is on S3."""
    if job.source_dir:
        return None if job.source_dir.startswith("s3://") else resolve_path(base, job.source_dir)
    return resolve_path(base, job.entry_point).parent


def entry_point_path(job: JobConfig, base: Path) -> Path | None:
    """The entry point on this machine; None when source_dir is on S3."""
    return entry_point_file(job.entry_point, job.source_dir, base)


def entry_point_file(entry_point: str, source_dir: str | None, base: Path) -> Path | None:
    """entry_point_path of these two fields' values."""
    if source_dir:
        return None if source_dir.startswith("s3://") else resolve_path(base, source_dir) / entry_point
    return resolve_path(base, entry_point)


def check_hyperparameters(ctx: Context) -> list[Issue]:
    """smlaunch's train.py: names it does not know (each does nothing there: an error where the name
    surely means a known one, Hugging Face's name for it or a typo of it, as the job would quietly train
    without it; else a warning), its presets, AWS's script's arguments it does not do
    (aws_arguments.py). A user script's names are its own."""
    hp = ctx.hp
    if not ctx.runtime:
        return []
    issues = aws_arguments.runtime_issues(hp)
    known = TrainingHyperparameters.model_fields
    for key in hp.extra_keys:
        if key in aws_arguments.BY_NAME or key in DIRECTORY_ARGUMENTS:  # train.py's too (AWS's: done, or refused)
            continue
        hint = known_name_hint(key, known)
        issues.append(Issue(f"{HP}.{key}", (hp.model_extra or {})[key],
                            "not a hyperparameter smlaunch's train.py knows: it is passed to the script, which "
                            "does nothing with it",
                            hint or "remove it; `smlaunch schema` lists the hyperparameters train.py takes (a script "
                            "of your own as entry_point reads its own)",
                            "error" if meant_as_known(key, known) else "warning"))
    if hp.model_preset and hp.model_preset not in PRESETS:
        issues.append(Issue(f"{HP}.model_preset", hp.model_preset, "unknown model preset",
                            did_you_mean(hp.model_preset, PRESETS)))
    return issues


# Validation shows and checks images in this region when the job names none (the backend then
# takes the boto3 chain's).
DEFAULT_REGION = "us-east-1"


def check_image(ctx: Context) -> list[Issue]:
    """The image exists and the SageMaker SDK would accept it; smlaunch's runtime gets torch >= 2.6."""
    job = ctx.job
    if not job.on_sagemaker or ctx.instance is None:
        return []
    try:
        choice = job_image_choice(job, ctx.instance.name, job.region or DEFAULT_REGION, runtime=ctx.runtime)
    except ImageResolutionError as exc:
        return [Issue(exc.field, exc.value, exc.problem, exc.fix)]
    issues = []
    image_region = ecr_region(choice.uri)
    if job.region and image_region and image_region != job.region:
        issues.append(Issue("image_uri", job.image_uri, f"is in {image_region}, and SageMaker pulls the training "
                            f"image from the job's region ({job.region})",
                            f"use the image's copy in {job.region}; for AWS's PyTorch images leave image_uri "
                            "out and set framework_version (or nothing, for smlaunch's runtime)", "warning"))
    if ctx.runtime and job.enable_network_isolation and choice.torch is not None:
        from launcher.config.requirements import RUNTIME_DISTRIBUTIONS

        issues.append(Issue("enable_network_isolation", True,
                            f"the code archive's requirements.txt ({', '.join(RUNTIME_DISTRIBUTIONS)}) is "
                            "installed with pip in the container, and an AWS PyTorch image may lack some of them",
                            "use an image that has them (image_uri), or turn network isolation off", "warning"))
    return issues


def resolve_path(base: Path, path: str) -> Path:
    """A job-file path (plain or file://, ~ expanded) relative to the job file's directory."""
    p = Path(os.path.expanduser(path.removeprefix("file://")))  # an unknown ~user stays as written
    return p if p.is_absolute() else base / p
