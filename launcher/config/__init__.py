"""Job configuration: pydantic models and the rules that check them (no boto3, no torch).

The names below load on first use, so that importing one module of the package (the CLI's error
reporting imports launcher.wire.training.issues) does not import every model and rule with it.
"""

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

# Imports inside functions: the names of __all__ load on first use (CLI start-up: `smlaunch --help`
# and the commands that only report errors import neither the models nor the rules).


def __getattr__(name: str):
    if name in ("ChannelInput", "JobConfig", "JobFile"):
        from launcher.config import job as home
    elif name == "Distribution":
        from launcher.config import distribution as home
    elif name == "ModelParallelParameters":
        from launcher.wire.training import degrees as home
    elif name in ("FP8Config", "TrainingHyperparameters"):
        from launcher.wire.training import hyperparameters as home
    elif name in ("ConfigError", "Issue"):
        from launcher.wire.training import issues as home
    elif name == "ParallelLayout":
        from launcher.wire.training import layout as home
    elif name in ("ValidatedJob", "validate_job"):
        from launcher.config import validate as home
    else:
        raise AttributeError(f"module 'launcher.config' has no attribute {name!r}")
    return getattr(home, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
