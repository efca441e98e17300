"""What a tracker's run is told about the job: its name, its validated hyperparameters (secrets
masked as in everything else smlaunch shows, launcher.wire.masking), and the plan's prediction the
job carries in its code archive (launcher.wire.job_plan)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import container
from launcher.wire.masking import mask_secrets
from launcher.wire.training.hyperparameters import TrainingHyperparameters

# Imports inside functions: the plan's file (launcher.wire.job_plan) only where a W&B or MLflow run is
# told about the job, on rank 0 of a job that names one; every rank imports this module (the trackers').

# SageMaker sets TRAINING_JOB_NAME in every training container (smlaunch's docker runner too); the
# bootstrap hands the ranks SAGEMAKER_JOB_NAME from the job's sagemaker_job_name hyperparameter.
JOB_NAME_VARIABLES = ("TRAINING_JOB_NAME", "SAGEMAKER_JOB_NAME")


@dataclass(frozen=True)
class RunInfo:
    job_name: str | None
    hyperparameters: dict  # validated values, secret-named ones '****'
    facts: dict  # the job's name, world size, instance type and plan: what the hyperparameters do not say

    def flat_facts(self) -> dict[str, str]:
        """The facts as `smlaunch.<key>` text, the plan's as `smlaunch.plan.<key>` (MLflow's tags)."""
        flat = {}
        for key, value in self.facts.items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, item in items:
                flat[".".join(filter(None, ("smlaunch", key, sub)))] = str(item)
        return flat


def run_info(hp: TrainingHyperparameters, world_size: int, instance_type: str | None) -> RunInfo:
    job_name = next((os.environ[v] for v in JOB_NAME_VARIABLES if os.environ.get(v)), None)
    facts = {"job_name": job_name, "world_size": world_size, "instance_type": instance_type, "plan": shipped_plan()}
    return RunInfo(job_name, mask_secrets(hp.model_dump(exclude_none=True)),
                   {k: v for k, v in facts.items() if v is not None})


def shipped_plan() -> dict | None:
    """The prediction in `_smlaunch/`, where this runtime's packages came from; None run from a checkout."""
    from launcher.wire import job_plan

    return job_plan.read(Path(container.__file__).resolve().parents[1])
