"""The runtime API (SMP v2's `init()`): distribution config -> process group -> DeviceMesh.

The mesh is (pp, dp_replicate, dp_shard, cp, tp) with pp outermost and tp and cp innermost
(docs/smp.md). Named views, each within one pipeline stage:
  "dp"          dp_replicate x dp_shard   ranks with distinct batches (data loading)
  "dp_shard_cp" dp_shard x cp             the FSDP sharding group
  "dp_cp"       dp_replicate x dp_shard x cp   ranks that hold distinct tokens (loss reduction)

A job never hangs on a failed rank. Every process group, the mesh's included, times out after
`collective_timeout` seconds, so a rank left alone in a collective fails instead of waiting for
hours. A rank that fails leaves at once, without another collective (`run_rank`), so torchrun
sees it exit and stops the others; and a rank whose torchrun agent dies is killed with it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.distributed_c10d import _set_pg_timeout

from container.resilience.attempt import record_failure
from container.resilience.step_watch import stacks_on_signal
from launcher.wire.hyperparameters import parse_mp_parameters
from launcher.wire.opt_ml import free_port
from launcher.wire.training import shrink
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.hyperparameters import COLLECTIVE_TIMEOUT_DEFAULT_S
from launcher.wire.training.layout import ParallelLayout, layout_problems, with_sharding_strategy

log = logging.getLogger("smlaunch")

# torchrun reports the first rank whose exit it sees as the root cause; a rank whose collective
# broke under it waits this long, so that the peer which failed first is seen first.
PEER_FAILURE_GRACE_S = 2.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    params: ModelParallelParameters
    layout: ParallelLayout
    mesh: DeviceMesh
    flat: dict[str, DeviceMesh]  # the flattened views, kept as torch asks (not re-sliced from the root)
    collective_timeout: timedelta  # of every group, the ones made later too (a background save's)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        return self.flat["dp"].get_local_rank()

    @property
    def dp_size(self) -> int:
        return self.layout.data_parallel

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """1-D sharding mesh, or 2-D (replicate, shard) for hybrid sharding."""
        if self.layout.dp_replicate > 1:
            # FSDP2's HSDP needs this 2-D (replicate, shard) view; torch >= 2.11 warns once per rank
            # that slicing a flattened dim will be deprecated, and offers no other way to build it.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Slicing a flattened dim", category=UserWarning)
                return self.mesh["dp_replicate", "dp_shard_cp"]
        return self.flat["dp_shard_cp"]

    @property
    def loss_group(self):
        return self.flat["dp_cp"].get_group()

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline stage (of its first stage, with several stages per rank)."""
        return self.mesh.get_local_rank("pp")

    @property
    def pp_group(self):
        """The ranks that hold the other pipeline stages of this rank's model replica; None without pp."""
        return self.mesh.get_group("pp") if self.layout.pp > 1 else None


def distribution_parameters(mp_parameters: str | dict | None = None, **explicit) -> ModelParallelParameters:
    """The model-parallel parameters in force: `mp_parameters` (argument, else SM_HP_MP_PARAMETERS),
    with explicit script arguments (the seed's --hybrid_shard_degree ...) that must agree."""
    raw = mp_parameters if mp_parameters not in (None, "") else os.environ.get("SM_HP_MP_PARAMETERS")
    params = parse_mp_parameters(raw)
    for key, value in explicit.items():
        if value is None:
            continue
        if key in params and params[key] != value:
            raise ValueError(f"--{key} {value} contradicts mp_parameters {key}={params[key]}; "
                             "set it in one place")
        params[key] = value
    return ModelParallelParameters.model_validate(params)


def init_runtime(params: ModelParallelParameters, *, sharding_strategy: str | None = None,
                 collective_timeout: int | None = None) -> Runtime:
    """Initialise the process group (NCCL on GPUs, gloo on CPU) and build the mesh. Every
    collective fails after `collective_timeout` seconds (default COLLECTIVE_TIMEOUT_DEFAULT_S)."""
    if "WORLD_SIZE" not in os.environ:  # a plain `python train.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun's agent
        _die_with_parent()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    timeout = timedelta(seconds=collective_timeout or COLLECTIVE_TIMEOUT_DEFAULT_S)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None, timeout=timeout)
    params = with_sharding_strategy(params, sharding_strategy, local_world)
    if (original := shrink.original_world(os.environ)) not in (None, world):  # before any work
        refuse(shrink.shrink_problems(params, original, world))
    _check_layout(params, world)
    layout = ParallelLayout.from_parameters(params, world)
    mesh = init_device_mesh(device.type, layout.mesh_shape, mesh_dim_names=ParallelLayout.mesh_dim_names)
    flat = {
        "dp": mesh["dp_replicate", "dp_shard"]._flatten("dp"),
        "dp_shard_cp": mesh["dp_shard", "cp"]._flatten("dp_shard_cp"),
        "dp_cp": mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp"),
    }
    _set_timeouts(timeout, [mesh.get_group(name) for name in ParallelLayout.mesh_dim_names]
                  + [view.get_group() for view in flat.values()])
    if rank == 0:
        log.info("mesh %s on %d rank(s), backend %s, collectives time out after %d s",
                 dict(zip(ParallelLayout.mesh_dim_names, layout.mesh_shape)), world, backend,
                 timeout.total_seconds())
    return Runtime(rank, world, local_rank, local_world, device, params, layout, mesh, flat, timeout)


def _set_timeouts(timeout: timedelta, groups: list) -> None:
    """The mesh creates its groups with torch's default timeout (10 min NCCL, 30 min gloo), not the
    default group's; the default group too, as it may have been created before init_runtime."""
    for group in {dist.group.WORLD, *groups}:
        _set_pg_timeout(timeout, group)


def _die_with_parent() -> None:
    """Linux: SIGKILL this rank when its parent, torchrun's agent, dies (PR_SET_PDEATHSIG): an
    orphaned rank would hold its accelerator and its peers' collectives until a timeout."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    if os.getppid() != parent:  # the parent died before prctl took effect: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)


def _check_layout(params: ModelParallelParameters, world: int) -> None:
    """The client validated the job; a job built by hand fails here, before any work, with the
    client's own check (launcher.wire.training.layout.layout_problems)."""
    refuse(layout_problems(params, world))


def refuse(problems: list, where: Callable[[object], str] = lambda p: "") -> None:
    """Raise the client's validation problems (each with key, value, problem, fix) as one error;
    `where` names a problem's section (e.g. "hyperparameter ") before its key."""
    if problems:
        raise ValueError("; ".join(f"{where(p)}{p.key} {p.value}: {p.problem} ({p.fix})" for p in problems)
                         + " (run `smlaunch validate` on the job for the full list)")


def shutdown() -> None:
    """After success only: a rank that failed must not enter a collective its peers never reach."""
    if dist.is_initialized():
        # A rank that tears gloo down while a peer still finishes its last collective makes the
        # peer abort (SIGABRT); the barrier lets everyone leave together.
        dist.barrier()
        dist.destroy_process_group()


_EXIT_CLEANUPS: list[Callable[[], None]] = []


def at_rank_exit(cleanup: Callable[[], None]) -> None:
    """`cleanup()` runs as `run_rank` leaves, before the os._exit that skips the interpreter's exit: for
    what a library of this rank removes there (wandb's temporary directories). No collective."""
    if cleanup not in _EXIT_CLEANUPS:
        _EXIT_CLEANUPS.append(cleanup)


def _run_exit_cleanups() -> None:
    for cleanup in _EXIT_CLEANUPS:
        try:
            cleanup()
        except Exception as exc:  # noqa: BLE001 - a cleanup that fails does not change the rank's exit code
            log.warning("at the rank's exit, %s failed: %s", getattr(cleanup, "__qualname__", cleanup), exc)


def run_rank(main: Callable[[list[str]], int], argv: list[str]) -> NoReturn:
    """Run a rank's `main(argv)` and leave the process at once with its exit code; on an
    exception, print its traceback (the bootstrap's failure report reads it) and exit 1, with no
    collective in between, so that torchrun sees the failure and stops the other ranks.
    From the start, SIGUSR1 writes the rank's stacks to its stderr (container.resilience.step_watch)."""
    stacks_on_signal()
    try:
        code = main(argv)
    except SystemExit as exc:  # sys.exit(...) inside main
        code = exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - every failure must end the process now
        code = _report_failure(exc)
    # Leave without interpreter finalization. DeviceMesh keeps its process groups referenced
    # after destroy_process_group, so they would be destructed during finalization, where a
    # gloo worker thread still alive now and then aborts the process (SIGABRT, "terminate
    # called without an active exception") after a run that succeeded; after a failure,
    # finalization could wait on a collective in flight. Flush what is buffered and go.
    _run_exit_cleanups()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    _exit(code)


def exit_code(exc: SystemExit) -> int:
    """What Python does with a SystemExit that ends the program: a message printed, exit code 1."""
    if exc.code is not None and not isinstance(exc.code, int):
        print(exc.code, file=sys.stderr)
    return exc.code if isinstance(exc.code, int) else int(exc.code is not None)


_exit: Callable[[int], NoReturn] = os._exit


def exit_with(leave: Callable[[int], NoReturn]) -> None:
    """`run_rank` leaves through `leave(code)`: a rank forked by container.distributed.forked_ranks
    first hands its agent the return value torch elastic waits for."""
    global _exit
    _exit = leave


def _report_failure(exc: BaseException) -> int:
    in_collective = _collective_failure(exc)
    record_failure(exc, in_collective)  # for the bootstrap's restart decision (launcher.wire.faults)
    log.error("rank %s failed%s; leaving now, without further collectives, so the job stops",
              os.environ.get("RANK", "0"),
              " in a collective (a peer that failed first, or stopped answering, is the likely cause)"
              if in_collective else "")
    traceback.print_exc()
    sys.stderr.flush()
    if in_collective and dist.is_initialized() and dist.get_world_size() > 1:
        time.sleep(PEER_FAILURE_GRACE_S)
    return 1


def _collective_failure(exc: BaseException | None) -> bool:
    """The exception (or one it was raised from) is a process group's: gloo and NCCL raise
    RuntimeError or torch.distributed.DistError when a peer leaves or a collective times out."""
    while exc is not None:
        if isinstance(exc, dist.DistError) or (
                isinstance(exc, RuntimeError) and any(mark in str(exc) for mark in ("gloo/", "NCCL", "c10d"))):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
