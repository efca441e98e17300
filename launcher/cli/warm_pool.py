"""`smlaunch warm-pool update|terminate JOB`: a SageMaker job's warm pool, kept longer, shorter or ended.

UpdateTrainingJob with ResourceConfig.KeepAlivePeriodInSeconds (0 ends the pool, as AWS documents);
AWS changes only an Available pool, so the job's pool is described and checked first
(launcher.backends.warm_pools). `smlaunch status JOB` shows the pool and its time left.
"""

from __future__ import annotations

import click

# Imports inside functions: the backends load when the command runs (CLI start-up).
from launcher.cli.support import JOB_HELP, aws_call, region_option
from launcher.wire.training.base import KEEP_ALIVE_MAX


@click.group(name="warm-pool")
def warm_pool() -> None:
    """Keep a SageMaker job's warm pool longer or shorter, or end it (its status: smlaunch status JOB)."""


def _change(job: str, region: str | None, seconds: int) -> None:
    from launcher.backends.warm_pools import WarmPoolError, check_keep_alive

    def not_sagemaker(kind: str) -> WarmPoolError:
        return WarmPoolError(f"{job} is a {kind} job: warm pools are SageMaker's (a {kind} job's hosts are not "
                             "kept after it ends); name a SageMaker training job")

    def run():
        from launcher.backends import registry
        from launcher.config.backend_table import named

        check_keep_alive(seconds)  # both checks before any AWS call
        kind, _ = registry.parse_handle(job)
        if kind is not None and not named(kind).sagemaker_jobs:
            raise not_sagemaker(kind)
        backend, name = registry.find(job, region=region)
        if not named(backend.name).sagemaker_jobs:  # a bare name of a job of smlaunch's job store
            raise not_sagemaker(backend.name)
        pool = backend.update_keep_alive(name, seconds)
        if seconds == 0:
            click.echo(f"terminating the warm pool of {name} (Available, {pool.seconds_left()} s left of "
                       f"{pool.keep_alive} s)")
        else:
            click.echo(f"warm pool of {name}: keep-alive {pool.keep_alive} s -> {seconds} s, counted from the "
                       "job's end")

    aws_call(run)


@warm_pool.command(epilog=JOB_HELP)
@click.argument("job")
@click.option("--keep-alive", "seconds", type=int, required=True, metavar="SECONDS",
              help=f"The new keep-alive period, 0 to {KEEP_ALIVE_MAX} s (0 ends the pool).")
@region_option
def update(job: str, seconds: int, region: str | None) -> None:
    """Set the keep-alive period of a job's Available warm pool."""
    _change(job, region, seconds)


@warm_pool.command(epilog=JOB_HELP)
@click.argument("job")
@region_option
def terminate(job: str, region: str | None) -> None:
    """End a job's Available warm pool now (keep-alive 0), so it is billed no longer."""
    _change(job, region, 0)
