"""SageMaker managed warm pools: which later job reuses a pool, and what validate says about one.

AWS's rule ("Matching training jobs" in the developer guide; docs/sagemaker-warm-pools.md): a pool
moves to the next job only if these fields of the two CreateTrainingJob requests (DescribeTrainingJob
carries them under the same names) are identical. Validate runs offline, so it states the rule; submit,
with credentials, compares the request with the jobs whose pool is Available
(launcher.backends.warm_pools).
"""

from __future__ import annotations

from typing import Any

from launcher.config import backend_table
from launcher.config.context import Context
from launcher.wire.training.issues import Issue

FIELD = "keep_alive_period_in_seconds"

# (request path, what a user calls it, its value when the request leaves it out)
MATCH_FIELDS: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("RoleArn",), "role", None),
    (("ResourceConfig", "InstanceType"), "instance_type", None),
    (("ResourceConfig", "InstanceCount"), "instance_count", None),
    (("ResourceConfig", "VolumeSizeInGB"), "volume_size", None),
    (("ResourceConfig", "VolumeKmsKeyId"), "volume_kms_key", None),
    (("VpcConfig", "Subnets"), "subnets", None),
    (("VpcConfig", "SecurityGroupIds"), "security_group_ids", None),
    (("EnableInterContainerTrafficEncryption",), "encrypt_inter_container_traffic", False),
    (("EnableNetworkIsolation",), "enable_network_isolation", False),
)
MATCH_RULE = ("a later job reuses the pool only if its " + ", ".join(name for _, name, _ in MATCH_FIELDS)
              + " are the same as this job's (AWS's matching rule), within the keep-alive period")


def _value(request: dict, path: tuple[str, ...], default: Any) -> Any:
    node: Any = request
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return default
    return sorted(node) if isinstance(node, list) else node  # the order of subnets or groups is no difference


def mismatches(pool_job: dict, request: dict) -> list[tuple[str, Any, Any]]:
    """(field, the pool's job's value, the request's value) for each matching field that differs;
    [] when the request would reuse the pool of `pool_job` (both CreateTrainingJob-shaped)."""
    out = []
    for path, name, default in MATCH_FIELDS:
        theirs, ours = _value(pool_job, path, default), _value(request, path, default)
        if theirs != ours:
            out.append((name, theirs, ours))
    return out


def check_warm_pool(ctx: Context) -> list[Issue]:
    """What keep_alive_period_in_seconds does for this job, or why it cannot."""
    job = ctx.job
    seconds = job.keep_alive_period_in_seconds
    if seconds is None:
        return []
    if not job.on_sagemaker:
        row = backend_table.named(job.backend_name)
        hosts = "this machine" if row is not None and row.on_this_machine else f"{job.backend_name}'s own nodes"
        return [Issue(FIELD, seconds, f"warm pools are SageMaker's: with backend {job.backend_name} the job runs on "
                      f"{hosts}, and nothing is kept for a next job",
                      f"drop it for {job.backend_name} runs, or run on SageMaker", "warning")]
    if job.use_spot_instances and seconds:
        return [Issue(FIELD, seconds, "warm pools do not work with managed spot training",
                      "remove it or set use_spot_instances: false")]
    if job.instance_groups and seconds:
        return [Issue(FIELD, seconds, "warm pools do not work with heterogeneous clusters (instance_groups)",
                      "remove it, or use instance_type and instance_count")]
    if not seconds:
        return []
    return [Issue(FIELD, seconds, f"SageMaker keeps this job's instances for {seconds} s after it ends, billed "
                  f"per instance while kept; {MATCH_RULE}",
                  "`smlaunch warm-pool update JOB --keep-alive N` changes the period, "
                  "`smlaunch warm-pool terminate JOB` ends it", "info",
                  detail="AWS keeps a pool only where the account has a warm-pool quota for the instance type "
                         "(default 0); `smlaunch submit` names the Available pool the job will reuse")]
