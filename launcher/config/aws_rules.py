"""Rules for the SDK v2 settings that shape the AWS side of a job: managed spot training, VPC, network
isolation, heterogeneous clusters, private registries, Debugger/profiler, and what a run elsewhere
(local, Slurm, Kubernetes) cannot honour.

Where the SDK drops a half-given setting without a word (subnets without security groups, a
registry credentials provider without Vpc access), smlaunch refuses it: the user asked for it.
"""

from __future__ import annotations

import os

from launcher.config import backend_table
from launcher.config.context import Context
from launcher.config.debugger import DebuggerSettingError, debugger_fields, profiler_fields
from launcher.config.job_rules import DEFAULT_REGION
from launcher.wire.training.issues import Issue
from launcher.wire.training.model_source import FIELD as MODEL_SOURCE
from launcher.wire.training.model_source import ModelSourceError, parse_model_source

# Settings only SageMaker itself can carry out; a run elsewhere (a backend whose row of the backend
# table has no aws_settings) says it leaves them out.
AWS_ONLY = ("subnets", "security_group_ids", "encrypt_inter_container_traffic", "enable_network_isolation",
            "max_retry_attempts", "volume_kms_key", "output_kms_key", "rules",
            "profiler_config", "instance_groups", "training_repository_access_mode", "enable_infra_check",
            "enable_remote_debug", "enable_session_tag_chaining", "training_plan", "instance_placement_config",
            "experiment_config", "container_entry_point", "container_arguments", "model_uri",
            "debugger_hook_config", "disable_output_compression", "enable_sagemaker_metrics",
            "use_spot_instances", "max_wait")


def check_aws_settings(ctx: Context) -> list[Issue]:
    job = ctx.job
    if not backend_table.named(job.backend_name).aws_settings:
        return [Issue(name, getattr(job, name), f"has no effect with backend {job.backend_name} "
                      "(SageMaker carries it out)", f"drop it for {job.backend_name} runs, or run on SageMaker",
                      "warning")
                for name in AWS_ONLY if getattr(job, name) not in (None, False, [])]
    return (_spot(job) + _vpc(job) + _registry(job) + _network_isolation(ctx) + _instance_groups(ctx)
            + _debugger(job) + _model_uri(job))


def _spot(job) -> list[Issue]:
    if not job.use_spot_instances:
        return [] if job.max_wait is None else [Issue("max_wait", job.max_wait, "only applies to spot training",
                                                      "set use_spot_instances: true or remove max_wait")]
    issues = []
    if job.max_wait is not None and job.max_wait < job.max_run:
        issues.append(Issue("max_wait", job.max_wait, f"is less than max_run ({job.max_run})",
                            f"use max_wait >= {job.max_run}"))
    if job.checkpoint_s3_uri is None:
        issues.append(Issue("checkpoint_s3_uri", None, "spot instances can be interrupted and the job restarts "
                            "from scratch", "set checkpoint_s3_uri so training resumes", "warning"))
    return issues


def _vpc(job) -> list[Issue]:
    if bool(job.subnets) == bool(job.security_group_ids):
        return []
    given, missing = ("subnets", "security_group_ids") if job.subnets else ("security_group_ids", "subnets")
    return [Issue(missing, None, f"a VPC needs both subnets and security_group_ids, and {given} is set "
                  "(the SageMaker SDK would drop the VPC without a word)",
                  f"set {missing} as well, or remove {given}")]


def _registry(job) -> list[Issue]:
    if job.training_repository_credentials_provider_arn and job.training_repository_access_mode != "Vpc":
        return [Issue("training_repository_credentials_provider_arn",
                      job.training_repository_credentials_provider_arn,
                      "is only used when the image comes from a private registry in your VPC",
                      "set training_repository_access_mode: Vpc, or remove it")]
    if job.training_repository_access_mode == "Vpc" and not job.subnets:
        return [Issue("training_repository_access_mode", "Vpc", "pulls the image through your VPC, "
                      "but the job has no VPC", "set subnets and security_group_ids")]
    return []


def _network_isolation(ctx: Context) -> list[Issue]:
    job = ctx.job
    if not job.enable_network_isolation:
        return []
    issues = []
    if ctx.runtime and _hub_model(job, ctx.base_dir):
        source = job.hyperparameters.raw()["hf_pretrained_model_name_or_dir"]
        issues.append(Issue(MODEL_SOURCE, source,
                            "is a Hugging Face Hub id, and enable_network_isolation leaves the container "
                            "no network to download it", "put the model in S3 and pass it as an input "
                            "channel (see docs/models.md), or turn network isolation off"))
    if ctx.base_dir and job.source_dir and os.path.isfile(ctx.base_dir / job.source_dir / "requirements.txt"):
        issues.append(Issue("enable_network_isolation", True, "the container installs requirements.txt "
                            "with pip before training, which fails without network for any package the "
                            "image lacks", "use an image that has the packages (image_uri), or turn network "
                            "isolation off", "warning"))
    return issues


def _hub_model(job, base_dir) -> bool:
    source = job.hyperparameters.raw().get("hf_pretrained_model_name_or_dir")
    if not isinstance(source, str):
        return False
    code_dir = base_dir / job.source_dir if job.source_dir else base_dir
    try:
        return parse_model_source(source, job.channels(), code_dir).kind == "hub"
    except ModelSourceError:
        return False  # reported by the model rules


def _instance_groups(ctx: Context) -> list[Issue]:
    job = ctx.job
    dist = job.distribution
    named = dist.instance_groups if dist else None
    if named and not job.instance_groups:
        return [Issue("distribution.instance_groups", named, "names instance groups, but the job has none",
                      "set instance_groups, or remove distribution.instance_groups")]
    if not job.instance_groups:
        return []
    names = [g.instance_group_name for g in job.instance_groups]
    issues = []
    if len(set(names)) != len(names):
        issues.append(Issue("instance_groups", names, "has two groups of the same name", "name each group once"))
    if len(names) > 1 and dist is not None and not named:
        issues.append(Issue("distribution.instance_groups", None, "with several instance groups the SDK needs "
                            "the one that trains", f"set distribution.instance_groups: [{names[0]!r}]"))
    if named and not (dist.mpi_enabled or dist.dataparallel_enabled):
        issues.append(Issue("distribution.instance_groups", named, "heterogeneous clusters train with mpi or "
                            "smdistributed.dataparallel only (as in the SageMaker SDK)",
                            "enable one of them, or use instance_type and instance_count"))
    if ctx.runtime and len({g.instance_type for g in job.instance_groups}) > 1:
        issues.append(Issue("instance_groups", [g.instance_type for g in job.instance_groups],
                            "smlaunch's runtime trains on one instance type", "use one instance group"))
    return issues


def _debugger(job) -> list[Issue]:
    region = job.region or DEFAULT_REGION
    try:
        debugger_fields(job, region=region, output_path="s3://output/")
        profiler_fields(job, region=region, output_path="s3://output/")
    except DebuggerSettingError as exc:
        return [Issue(exc.field, exc.value, exc.problem, exc.fix)]
    return []


def _model_uri(job) -> list[Issue]:
    if job.model_uri and not job.model_uri.startswith("s3://"):
        return [Issue("model_uri", job.model_uri, "SageMaker reads model artifacts from S3",
                      "upload them and use s3://..., or run with instance_type: local")]
    return []

