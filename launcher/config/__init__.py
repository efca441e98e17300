"""Job configuration: pydantic models and the rules that check them (no boto3, no torch)."""

from launcher.config.distribution import Distribution, ModelParallelParameters
from launcher.config.hyperparameters import FP8Config, TrainingHyperparameters
from launcher.config.issues import ConfigError, Issue
from launcher.config.job import ChannelInput, JobConfig, JobFile
from launcher.config.layout import ParallelLayout
from launcher.config.validate import ValidatedJob, validate_job

__all__ = [
    "ChannelInput",
    "ConfigError",
    "Distribution",
    "FP8Config",
    "Issue",
    "JobConfig",
    "JobFile",
    "ModelParallelParameters",
    "ParallelLayout",
    "TrainingHyperparameters",
    "ValidatedJob",
    "validate_job",
]
