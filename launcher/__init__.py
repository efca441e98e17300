"""smlaunch client SDK: validated SageMaker-style training jobs.

Importing this package is cheap (no boto3, no torch); `PyTorch` is loaded on first use.
"""

__all__ = ["ConfigError", "PyTorch", "validate_job"]


def __getattr__(name):
    if name == "PyTorch":
        from launcher.estimator import PyTorch

        return PyTorch
    if name in ("ConfigError", "validate_job"):
        from launcher import config

        return getattr(config, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
