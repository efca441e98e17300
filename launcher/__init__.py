"""smlaunch client SDK: validated SageMaker-style training jobs.

Importing this package is cheap (no boto3, no torch); `PyTorch` and `ModelTrainer` (the SDK v3
front-end; its config shapes are in `launcher.sdk.model_trainer`) are loaded on first use.
"""

__all__ = ["CategoricalParameter", "ConfigError", "ContinuousParameter", "HyperparameterTuner", "IntegerParameter",
           "ModelTrainer", "PyTorch", "WarmStartConfig", "WarmStartTypes", "validate_job"]

# The tuner's objects (launcher.sdk.tuner_objects), by the SDK's names.
_TUNER_OBJECTS = ("CategoricalParameter", "ContinuousParameter", "IntegerParameter", "WarmStartConfig",
                  "WarmStartTypes", "HyperbandStrategyConfig", "StrategyConfig", "TuningJobCompletionCriteriaConfig")

# Imports inside functions: `import launcher` stays cheap; PyTorch and ModelTrainer load on first use.


def __getattr__(name):
    if name == "PyTorch":
        from launcher.sdk.estimator import PyTorch

        return PyTorch
    if name == "ModelTrainer":
        from launcher.sdk.model_trainer import ModelTrainer

        return ModelTrainer
    if name == "HyperparameterTuner":
        from launcher.sdk.tuner import HyperparameterTuner

        return HyperparameterTuner
    if name in _TUNER_OBJECTS:
        from launcher.sdk import tuner_objects

        return getattr(tuner_objects, name)
    if name in ("ConfigError", "validate_job"):
        from launcher import config

        return getattr(config, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
