"""`from launcher.model_trainer import SourceCode, Compute, ...`, as the README has long shown:
the SDK v3 front-end lives in launcher.sdk.model_trainer; this name stays for users' scripts."""

from launcher.sdk.model_trainer import *  # noqa: F403
from launcher.sdk.model_trainer import __all__  # noqa: F401
