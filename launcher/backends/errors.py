"""The errors a backend raises (re-exported by launcher.backends.base, the interface): in a module
of their own so that what the interface names (a job's metric records) may raise them too.
"""

from __future__ import annotations


class BackendError(RuntimeError):
    """A backend could not do what was asked (missing bucket, name taken, AWS error, ...)."""


class SettingError(BackendError):
    """What was asked of a submitted job needs a setting it was not given (the message names the field
    and the fix): a usage error, exit code 2, as a refused job file is."""


class FilesElsewhere(BackendError):
    """A job's files are not readable on this machine; the message says where they are and how to read
    them (an answer, not a failure: a SageMaker job's output.tar.gz, a claim not mounted here)."""
