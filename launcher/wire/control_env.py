"""smlaunch's control variables: the `SMLAUNCH_*` variables its bootstrap and runtime read from their
environment. smlaunch sets each of them for a job's processes, or leaves it unset, and never takes
one from the caller's shell (docs/faults.md, "Fault injection, for tests").

A local or Slurm job's hosts start with the caller's environment (the process runner's, and the one
sbatch gives the batch script), so without this an `export SMLAUNCH_FAULT_INJECTION=...` armed every
job, `SMLAUNCH_MAX_RESTARTS` gave a job restarts past its `max_restarts` (and past its bound) and
`SMLAUNCH_ATTEMPT` spent them: smlaunch sets those only where they are not zero. A test arms fault
injection in the job's own `environment:`, which `validate` points out. The client's own settings
(`SMLAUNCH_HOME`, `SMLAUNCH_CONTAINER_ENGINE`) are no control variables: no job process reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.wire import faults, forked_ranks, heartbeat, opt_ml, pod_config, restart_policy
from launcher.wire.training.shrink import ORIGINAL_WORLD_ENV

CONTROL_VARIABLES = (
    faults.MAX_RESTARTS_ENV, faults.ATTEMPT_ENV, faults.FAULT_DIR_ENV, faults.FAULT_ENV,
    restart_policy.EXIT_CODES_ENV, restart_policy.JOB_ERRORS_ENV, faults.HANG_TIMEOUT_ENV,
    ORIGINAL_WORLD_ENV,  # the world before a shrink (launcher.wire.training.shrink)
    heartbeat.HEARTBEAT_DIR_ENV,  # where a user's script's ranks beat (launcher.wire.heartbeat)
    forked_ranks.RANKS_DIR_ENV,  # where forked ranks record their variables (launcher.wire.forked_ranks)
    forked_ranks.TEMPLATE_ENV,  # a local job's hosts' agent template (container.distributed.zygote)
    "SMLAUNCH_BOOTSTRAP_PID",  # the host a `host` fault injection ends (container.resilience.inject)
    "SMLAUNCH_MASTER_ADDR", "SMLAUNCH_MASTER_PORT",  # the simulated hosts' rendezvous (container.toolkit.bootstrap)
    "SMLAUNCH_CHECKPOINT_DIR",  # the hosts' shared checkpoints (container.args)
    "SMLAUNCH_LOCAL_JOB",  # the mark of a local job's processes (launcher.local.leftovers)
    opt_ml.REQUIREMENTS_INSTALLED_ENV,
    pod_config.CONFIG_DIR_ENV, pod_config.SCRATCH_DIR_ENV, pod_config.SECRET_HYPERPARAMETERS_ENV,
    pod_config.LAUNCHER_ENV,
)


def in_shell(environ: Mapping[str, str]) -> list[str]:
    """The control variables `environ` (the caller's) sets, which no job gets."""
    return sorted(name for name in CONTROL_VARIABLES if name in environ)


def without_control(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without smlaunch's control variables: what a job's processes may inherit of it."""
    return {name: value for name, value in environ.items() if name not in CONTROL_VARIABLES}
