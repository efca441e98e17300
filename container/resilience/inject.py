"""Fault injection for tests only (launcher.wire.faults: SMLAUNCH_FAULT_INJECTION with its arming
prefix). The trainer calls `at_step` before each step's work and `poison` on each micro-batch's
token loss before its backward; with the variable unset both do nothing.

- exit: raise InjectedFault (the rank exits 1 with a traceback, as any error does)
- signal: SIGKILL this rank (a crash: no traceback, no record)
- hang: sleep for ever before the step's collectives, so the peers wait in them
- stop: SIGSTOP this rank (frozen: it answers nothing, not even SIGTERM); once continued (SIGCONT)
  it goes on with its step, as a rank stopped by hand or by a debugger does
- nonfinite: this rank's loss of the step is NaN, and so are the gradients of its backward (as
  with a real overflow), so the whole model's gradient norm is too. Under pipeline parallelism
  it poisons the loss normalisation of a rank that holds the last stage: the gradients only.
- host: SIGKILL this host: the host's other ranks, the bootstrap (SMLAUNCH_BOOTSTRAP_PID), torchrun
  and this rank, all at once as a host's power cut would
- host-gone: as host, and the host cannot come back in any later attempt: the file `host-gone` in its
  /opt/ml tree says so to the local supervisor's runner (launcher.local.process), written before the kill
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from launcher.wire.faults import FAULT_ENV, HOST_GONE, Fault, attempt, parse_faults

# Imports inside functions: a rank imports this module on every run; what only an injected host
# fault needs (the /proc reader) is imported when one is due.

log = logging.getLogger("smlaunch")
BOOTSTRAP_PID_ENV = "SMLAUNCH_BOOTSTRAP_PID"


class InjectedFault(RuntimeError):
    pass


def _faults() -> list[Fault]:
    rank, current = int(os.environ.get("RANK", "0")), attempt()
    return [f for f in parse_faults(os.environ.get(FAULT_ENV)) if f.rank == rank
            and (f.attempt is None or f.attempt == current)]


def _due(step: int, kinds: tuple[str, ...]) -> Fault | None:
    return next((f for f in _faults() if f.step == step and f.kind in kinds), None)


def at_step(step: int) -> None:
    fault = _due(step, ("exit", "signal", "hang", "stop", "host", HOST_GONE))
    if fault is None:
        return
    log.warning("fault injection (%s): %s on rank %d at step %d", FAULT_ENV, fault.kind, fault.rank, step)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if fault.kind == "exit":
        raise InjectedFault(f"injected fault at step {step} ({FAULT_ENV})")
    if fault.kind == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if fault.kind == HOST_GONE:
        (Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")) / HOST_GONE).touch()
    if fault.kind in ("host", HOST_GONE):
        _kill_host()
    while True:  # hang
        time.sleep(3600)


def _kill_host() -> None:
    # The other ranks are killed here, not left to torchrun's death (PR_SET_PDEATHSIG): that reaches
    # them only once torchrun has exited, and meanwhile a rank could see this rank's sockets close
    # and record a network error of its own, a failure a lost host never reports.
    from container.toolkit.frozen_ranks import children

    agent = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
    doomed = [pid for pid in children(agent) if pid != os.getpid()] if agent else []
    bootstrap = os.environ.get(BOOTSTRAP_PID_ENV)
    doomed += [int(bootstrap)] if bootstrap else []
    doomed += [agent] if agent else []
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def poison(step: int, loss):
    """`loss` times NaN where a nonfinite fault is due at `step` on this rank, else `loss`: given
    before backward, the gradients that flow from it are NaN too."""
    if _due(step, ("nonfinite",)) is None:
        return loss
    log.warning("fault injection (%s): non-finite loss on rank %s at step %d", FAULT_ENV,
                os.environ.get("RANK", "0"), step)
    return loss * float("nan")
