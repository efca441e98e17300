"""A job's hyperparameters as the v2 SDK sends them (before the wire encoding), and the
`distribution` they stand for (for attach): `PyTorch._pytorch_distribution_configuration` and
`Framework._distribution_configuration` of the SageMaker Python SDK 2.257.7.
"""

from __future__ import annotations

from typing import Any

from launcher.config.distribution import Distribution
from launcher.config.job import JobConfig
from launcher.wire.hyperparameters import PROCESSES_PER_HOST, parse_mp_parameters


def user_hyperparameters(job: JobConfig) -> dict[str, Any]:
    """The hyperparameters the user set, with the values as written (validated, not coerced)."""
    return dict(sorted(job.hyperparameters.raw().items()))


def distribution_hyperparameters(job: JobConfig, instance_type: str) -> dict[str, Any]:
    """What the v2 SDK adds for `distribution` (before JSON encoding): `PyTorch.
    _pytorch_distribution_configuration` and `Framework._distribution_configuration`."""
    dist = job.distribution
    if dist is None:
        return {}
    # With instance_groups the SDK's estimator has no instance_type, and says so: null.
    sent_type = None if job.instance_groups else instance_type
    out: dict[str, Any] = {}
    if dist.torchrun and dist.smdistributed is None:
        return {"sagemaker_torch_distributed_enabled": True, "sagemaker_instance_type": sent_type}
    if dist.instance_groups:
        out["sagemaker_distribution_instance_groups"] = list(dist.instance_groups)
    if dist.mpi is not None:
        out["sagemaker_mpi_enabled"] = dist.mpi.enabled
        if dist.mpi.processes_per_host:
            out["sagemaker_mpi_num_of_processes_per_host"] = dist.mpi.processes_per_host
        out["sagemaker_mpi_custom_mpi_options"] = dist.mpi.custom_mpi_options
    if dist.smdistributed is not None:
        mp = dist.modelparallel
        if mp is not None and mp.parameters.explicit():
            out["mp_parameters"] = mp.parameters.explicit()
        out["sagemaker_distributed_dataparallel_enabled"] = dist.dataparallel_enabled
        out["sagemaker_instance_type"] = sent_type
        if dist.dataparallel_enabled:
            dp = dist.smdistributed.dataparallel
            out["sagemaker_distributed_dataparallel_custom_mpi_options"] = dp.custom_mpi_options
    if dist.torchrun:
        out["sagemaker_torch_distributed_enabled"] = True
        out["sagemaker_instance_type"] = sent_type
    return out


def job_hyperparameters(job: JobConfig, *, instance_type: str, program: str, submit_directory: str,
                        job_name: str, region: str | None) -> dict[str, Any]:
    """Everything hyperparameters.json holds for a job (before JSON encoding): the user's values,
    the distribution's, ours, and the reserved keys the v2 SDK adds."""
    out = user_hyperparameters(job)
    out.update(distribution_hyperparameters(job, instance_type))
    if job.processes_per_host:
        out[PROCESSES_PER_HOST] = job.processes_per_host
    out.update({
        "sagemaker_program": program,
        "sagemaker_submit_directory": submit_directory,
        "sagemaker_container_log_level": job.container_log_level,
        "sagemaker_job_name": job_name,
    })
    if region:
        out["sagemaker_region"] = region
    return out


def distribution_from_hyperparameters(decoded: dict[str, Any]) -> dict | None:
    """Rebuild the `distribution` dict from a job's decoded hyperparameters (for attach)."""
    dist: dict[str, Any] = {}
    if decoded.get("sagemaker_torch_distributed_enabled"):
        dist["torch_distributed"] = {"enabled": True}
    if decoded.get("sagemaker_mpi_enabled"):
        mpi: dict[str, Any] = {"enabled": True}
        if decoded.get("sagemaker_mpi_num_of_processes_per_host"):
            mpi["processes_per_host"] = decoded["sagemaker_mpi_num_of_processes_per_host"]
        if decoded.get("sagemaker_mpi_custom_mpi_options"):
            mpi["custom_mpi_options"] = decoded["sagemaker_mpi_custom_mpi_options"]
        dist["mpi"] = mpi
    smd: dict[str, Any] = {}
    if "mp_parameters" in decoded:
        smd["modelparallel"] = {"enabled": True, "parameters": parse_mp_parameters(decoded["mp_parameters"])}
    if decoded.get("sagemaker_distributed_dataparallel_enabled"):
        smd["dataparallel"] = {"enabled": True}
    if smd:
        dist["smdistributed"] = smd
    if not dist:
        return None
    Distribution.model_validate(dist)
    return dist
