"""Which backend runs a job, and which one has a job a user names.

The backends are the rows of launcher.config.backend_table. A job handle names its backend:
`sagemaker:NAME`, `local:NAME`, `slurm:JOBID` (or `slurm:NAME`), `kubernetes:NAME`. A bare name is
looked for in smlaunch's job store (the jobs of every backend the table keeps there, whose record says
which), then on SageMaker.
A backend's module is imported only when a job names it: boto3 only for SageMaker.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

# Imports inside functions: a backend's module loads when a job names it, so `smlaunch status
# local:...` never imports the SageMaker backend's boto3.
from launcher.backends.base import Backend, BackendError, Options
from launcher.config import backend_table
from launcher.config.job_names import check_job_name
from launcher.wire.metric_lines import as_datetime
from launcher.wire.training.issues import ConfigError, Issue

if TYPE_CHECKING:  # `status` and `list` load this module, and need none of validation's rules
    from launcher.config.validate import ValidatedJob

# The names when this module loaded; what is asked of the registry reads the table itself.
BACKENDS = backend_table.names()


def _one_of(words: list[str]) -> str:
    """`a, b or c`."""
    return " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def handle_fix() -> str:
    """How a job may be named, every backend's prefix included."""
    forms = [f"{b.name}:{'JOBID' if b.job_ids else 'NAME'}" for b in backend_table.BACKENDS]
    return "name a job as " + _one_of(["NAME", *forms])


def backend_named(name: str, *, region: str | None = None, session: Any = None, runner: str = "process",
                  printer: Callable[[str], None] | None = None,
                  console: Callable[[str, str, str], None] | None = None, adopt_orphans: bool = False) -> Backend:
    """`console`: where a local job run in this process prints its hosts' lines (label, colour, line);
    the rest: launcher.backends.base.Options."""
    row = backend_table.named(name)
    if row is None:
        raise ConfigError([Issue("backend", name, "is not a backend of smlaunch",
                                 "use " + ", ".join(backend_table.names()))])
    options = Options(region=region, session=session, runner=runner, printer=printer, console=console,
                      adopt_orphans=adopt_orphans)
    return backend_table.load(row.engine).create(options)


def for_job(job: ValidatedJob, *, session: Any = None, printer: Callable[[str], None] | None = None,
            runner: str | None = None, console: Callable[[str, str, str], None] | None = None,
            adopt_orphans: bool = False) -> Backend:
    """The backend the validated job names (its `backend`, or what its instance type implies)."""
    cfg = job.config
    return backend_named(cfg.backend_name, region=cfg.region, session=session, runner=runner or cfg.local_runner,
                         printer=printer, console=console, adopt_orphans=adopt_orphans)


def parse_handle(handle: str, field: str = "job_name") -> tuple[str | None, str]:
    """(backend or None, job) of `backend:job` or a bare job name; ConfigError (naming `field`) if neither."""
    if not isinstance(handle, str) or ":" not in handle:
        return None, check_job_name(handle, field)
    prefix, _, rest = handle.partition(":")
    row = backend_table.named(prefix)
    if row is None:
        raise ConfigError([Issue(field, handle, f"names backend {prefix!r}, which smlaunch does not have",
                                 handle_fix())])
    if row.job_ids and rest.isdigit():
        return prefix, rest
    return prefix, check_job_name(rest, field)


def find(handle: str, *, region: str | None = None, session: Any = None,
         printer: Callable[[str], None] | None = None) -> tuple[Backend, str]:
    """(backend, job) for a handle; BackendError naming every place looked in when none has it.
    The handle is checked first, so a bad one costs no AWS call."""
    from launcher.local import store

    kind, job = parse_handle(handle)
    if kind is not None:
        backend = backend_named(kind, region=region, session=session, printer=printer)
        if backend_table.named(kind).in_job_store:
            if not backend.exists(job):
                raise BackendError(f"no {kind} job {job!r} (in {store.jobs_root()})")
            job = backend.resolve(job)
        return backend, job
    if store.exists(job):
        return backend_named(store.backend_of(store.read(job)), printer=printer), job
    stored = _one_of([b.name for b in backend_table.BACKENDS if b.in_job_store])
    return _on_sagemaker(job, region, session, printer, f"no job named {job!r}: not a {stored} job "
                                                        f"(in {store.jobs_root()})"), job


def _on_sagemaker(job: str, region: str | None, session: Any, printer, not_here: str) -> Backend:
    from botocore.exceptions import (  # only now: AWS is asked
        BotoCoreError,
        ClientError,
        NoCredentialsError,
    )

    try:
        backend = backend_named("sagemaker", region=region, session=session, printer=printer)
        found = backend.exists(job)
    except ConfigError as exc:  # no region: SageMaker cannot be asked at all
        raise BackendError(f"{not_here}, and SageMaker cannot be asked: {exc.issues[0].problem} "
                           f"({exc.issues[0].fix})") from None
    except NoCredentialsError:
        raise BackendError(f"{not_here}, and SageMaker cannot be asked: no AWS credentials found "
                           "(aws configure, AWS_PROFILE, or an instance role)") from None
    except (BotoCoreError, ClientError) as exc:  # no network, access denied
        raise BackendError(f"{not_here}, and SageMaker could not be asked: {exc}") from None
    if not found:
        raise BackendError(f"{not_here}, nor a SageMaker training job in {backend.region}")
    return backend


def list_all(backends: tuple[str, ...] | None = None, *, region: str | None = None, status: str | None = None,
             name_contains: str | None = None, max_results: int = 20) -> tuple[list[dict], list[str], dict[str, bool]]:
    """Jobs of every backend asked, newest first, with Backend, Handle and DurationSeconds; a note
    for each backend that could not be asked and for what a backend left out (damaged records);
    and the backends that could not be listed, each True when it failed rather than being
    unconfigured (SageMaker without a region or credentials)."""
    rows, notes, unlisted = [], [], {}
    for name in backends or backend_table.names():
        try:
            backend = backend_named(name, region=region)
            jobs = backend.list(status, name_contains, max_results)
        except Exception as exc:  # noqa: BLE001 - one unreachable engine must not hide the others' jobs
            notes.append(f"{name}: not listed: {_why(exc)}")
            unlisted[name] = not _unconfigured(exc)
            continue
        notes += [f"{name}: {note}" for note in getattr(backend, "unlisted", ())]
        rows += [{**j, "Backend": name, "Handle": f"{name}:{j['TrainingJobName']}",
                  "DurationSeconds": _duration(j)} for j in jobs]
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    rows.sort(key=lambda r: as_datetime(r.get("CreationTime")) or oldest, reverse=True)
    return rows[:max_results], notes, unlisted


def _unconfigured(exc: Exception) -> bool:
    """A backend this machine is not set up for (no AWS region or credentials), not one that failed."""
    return isinstance(exc, ConfigError) or type(exc).__name__ == "NoCredentialsError"


def _why(exc: Exception) -> str:
    if isinstance(exc, ConfigError):
        return f"{exc.issues[0].problem} ({exc.issues[0].fix})"
    if type(exc).__name__ == "NoCredentialsError":
        return "no AWS credentials found (aws configure, AWS_PROFILE, or an instance role)"
    return str(exc)


def _duration(job: dict) -> int | None:
    """Seconds from start (or creation) to end, or to now while it runs."""
    start = as_datetime(job.get("TrainingStartTime")) or as_datetime(job.get("CreationTime"))
    if start is None:
        return None
    end = as_datetime(job.get("TrainingEndTime")) or datetime.now(timezone.utc)
    return max(int((end - start).total_seconds()), 0)
