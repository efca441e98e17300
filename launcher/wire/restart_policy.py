"""The job's restart rules, as the client sets them and the bootstrap reads them (docs/faults.md,
"Recovery rules").

- `max_restarts`: restarts after a fault, counted over the whole job (SMLAUNCH_MAX_RESTARTS).
- `restart_on_exit_codes`: exit codes of a user's own script that always mean "restart me"
  (SkyPilot's `recover_on_exit_codes`): such a failure is restarted without counting against
  `max_restarts` (SMLAUNCH_RESTART_ON_EXIT_CODES, comma-separated).
- `restart_on_job_errors`: how many failures of the job's own (an error of its code, configuration
  or data) are retried, each one of the `max_restarts` restarts (SMLAUNCH_RESTART_ON_JOB_ERRORS).
- `hang_timeout`: a script of the user's own whose ranks neither compute nor write for this many
  seconds is hung (SMLAUNCH_HANG_TIMEOUT; container.toolkit.script_watch).

However many codes ask for it, a job restarts at most faults.MAX_RESTARTS times in all: one that fails
more often than that is not running, it is failing. Each variable is set only where the rule is
not its default, so the environment of a job without them is what it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.wire import faults

EXIT_CODES_ENV = "SMLAUNCH_RESTART_ON_EXIT_CODES"
JOB_ERRORS_ENV = "SMLAUNCH_RESTART_ON_JOB_ERRORS"
REQUESTED = "requested"  # the failure class of an exit code the job lists: restarted, not counted


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 0
    exit_codes: tuple[int, ...] = ()
    job_errors: int = 0
    hang_timeout: int = 0  # seconds; 0: not watched

    @property
    def restarts_anything(self) -> bool:
        return bool(self.max_restarts or self.exit_codes)

    @property
    def needs_bootstrap(self) -> bool:
        """Whether smlaunch's bootstrap must run the job's program (on AWS's images: its restart loop)."""
        return self.restarts_anything or bool(self.hang_timeout)

    def environment(self) -> dict[str, str]:
        """What the job's processes get (nothing for the defaults: the request stays the SDK's)."""
        values = {faults.MAX_RESTARTS_ENV: self.max_restarts, EXIT_CODES_ENV: ",".join(map(str, self.exit_codes)),
                  JOB_ERRORS_ENV: self.job_errors, faults.HANG_TIMEOUT_ENV: self.hang_timeout}
        return {name: str(value) for name, value in values.items() if value}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> RestartPolicy:
        """The rules the job's environment carries; PolicyError naming the variable if one is not
        what smlaunch writes."""
        codes = environ.get(EXIT_CODES_ENV, "")
        if codes and not all(part.isdigit() for part in codes.split(",")):
            raise PolicyError(f"{EXIT_CODES_ENV}={codes!r} is not a comma-separated list of exit codes")
        return cls(_count(environ, faults.MAX_RESTARTS_ENV), tuple(int(c) for c in codes.split(",") if c),
                   _count(environ, JOB_ERRORS_ENV), _count(environ, faults.HANG_TIMEOUT_ENV))

    def to_dict(self) -> dict:
        """The rules in the SageMaker restart loop's hyperparameter (launcher.wire.restart_loop)."""
        out = {"max_restarts": self.max_restarts}
        out.update({"restart_on_exit_codes": list(self.exit_codes)} if self.exit_codes else {})
        out.update({"restart_on_job_errors": self.job_errors} if self.job_errors else {})
        out.update({"hang_timeout": self.hang_timeout} if self.hang_timeout else {})
        return out

    @classmethod
    def from_dict(cls, values: dict) -> RestartPolicy:
        codes, errors = values.get("restart_on_exit_codes", []), values.get("restart_on_job_errors", 0)
        hang = values.get("hang_timeout", 0)
        if not (isinstance(codes, list) and all(_whole(c) for c in codes) and _whole(errors) and _whole(hang)
                and _whole(values.get("max_restarts"))):
            raise PolicyError(f"{values!r} is not what smlaunch writes")
        return cls(values["max_restarts"], tuple(codes), errors, hang)


def counted(attempt: int, records: list[faults.Restart]) -> int:
    """The restarts before `attempt` that count against max_restarts: every attempt after the
    first follows a restart, less those an exit code the job lists asked for (`records`: one host's,
    or the job's)."""
    return attempt - len({r.attempt for r in records if r.restarted and r.failure_class == REQUESTED
                          and r.attempt < attempt})


def job_errors_retried(records: list[faults.Restart]) -> int:
    return len({r.attempt for r in records if r.restarted and r.failure_class == faults.JOB_ERROR})


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(environ: Mapping[str, str], name: str) -> int:
    value = environ.get(name, "0")
    if not value.isdigit():
        raise PolicyError(f"{name}={value!r} is not a count (an integer >= 0)")
    return int(value)
