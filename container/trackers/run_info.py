"""What a tracker's run is told about the job: its name and its validated hyperparameters, secrets
masked as in everything else smlaunch shows (launcher.wire.masking)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from launcher.config import TrainingHyperparameters
from launcher.wire.masking import mask_secrets

# SageMaker sets TRAINING_JOB_NAME in every training container (smlaunch's docker runner too); the
# bootstrap hands the ranks SAGEMAKER_JOB_NAME from the job's sagemaker_job_name hyperparameter.
JOB_NAME_VARIABLES = ("TRAINING_JOB_NAME", "SAGEMAKER_JOB_NAME")


@dataclass(frozen=True)
class RunInfo:
    job_name: str | None
    hyperparameters: dict  # validated values, secret-named ones '****'
    facts: dict  # the job's name, world size and instance type: what the hyperparameters do not say


def run_info(hp: TrainingHyperparameters, world_size: int, instance_type: str | None) -> RunInfo:
    job_name = next((os.environ[v] for v in JOB_NAME_VARIABLES if os.environ.get(v)), None)
    facts = {"job_name": job_name, "world_size": world_size, "instance_type": instance_type}
    return RunInfo(job_name, mask_secrets(hp.model_dump(exclude_none=True)),
                   {k: v for k, v in facts.items() if v is not None})
