"""smlaunch client SDK: validated SageMaker-style training jobs.

Importing this package is cheap (no boto3, no torch); `PyTorch` and `ModelTrainer` (the SDK v3
front-end; its config shapes are in `launcher.sdk.model_trainer`) are loaded on first use.
"""

__all__ = ["ConfigError", "ModelTrainer", "PyTorch", "validate_job"]

# Imports inside functions: `import launcher` stays cheap; PyTorch and ModelTrainer load on first use.


def __getattr__(name):
    if name == "PyTorch":
        from launcher.sdk.estimator import PyTorch

        return PyTorch
    if name == "ModelTrainer":
        from launcher.sdk.model_trainer import ModelTrainer

        return ModelTrainer
    if name in ("ConfigError", "validate_job"):
        from launcher import config

        return getattr(config, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
