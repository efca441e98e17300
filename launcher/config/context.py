"""What the rules know about a job (`Context`): a module of its own, as every rules module and each
backend's section rules (launcher.config.backends) read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.config.job import JobConfig
from launcher.config.script_rules import uses_smp
from launcher.wire.training import catalog
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.models import ModelSpec


@dataclass
class Context:
    """What the rules know about a job: its instance, world size and model, where knowable."""

    job: JobConfig
    instance: catalog.InstanceType | None
    processes_per_host: int | None
    model: ModelSpec | None
    base_dir: Path
    runtime: bool = True  # smlaunch's training runtime, else a user script (job_kind.py)
    imports: list | None = None  # a user script's imports where its files are here (script_imports.py)
    code_dir: Path | None = None  # source_dir on this machine (None: on S3, or no source_dir)
    region: str = "us-east-1"  # the job's region, else validation's default (job_rules.DEFAULT_REGION)

    @property
    def smp_script(self) -> bool:
        """A user script that uses AWS's SMP library (v2 or v1): it lives by SMP's documented rules."""
        return not self.runtime and uses_smp(self.imports)

    @property
    def world(self) -> int | None:
        if self.processes_per_host is None:
            return None
        return self.job.instance_count * self.processes_per_host

    @property
    def params(self) -> ModelParallelParameters:
        return self.job.distribution.parameters if self.job.distribution else ModelParallelParameters()

    @property
    def hp(self) -> TrainingHyperparameters:
        return self.job.hyperparameters
