"""torchrun's agent for smlaunch's own runtime: it imports the runtime once, then forks the ranks.

A rank that torchrun starts as a program imports torch, DTensor, dynamo and the runtime afresh:
~4.4 of the ~5 CPU seconds a rank of a small job takes before its first step, on every host, rank
and restart attempt. This agent is torchrun (torch.distributed.run, the same arguments and
rendezvous, `--start-method fork --run-path`) run after `import container.trainer`, so each rank
is a fork that has it all already. The bootstrap runs it for an entry point that is smlaunch's
runtime (launcher.wire.runtime_script); a user's own script runs under plain torchrun.

Each forked rank is made to look like the program torchrun would have started (`_start_rank`):
its own session, the default signal handlers, torchrun's OMP_NUM_THREADS applied, the script's
directory first on sys.path, and its rank's variables recorded where the bootstrap reads a rank's
environment (launcher.wire.forked_ranks). It leaves as the program would, with os._exit and its
code (`run_rank`), after a success first handing its agent the return value torch elastic waits
for (`_leave`).

The agent must not initialize CUDA before it forks (a forked child cannot use a driver its
parent initialized): it refuses to start if the preload did, and torch's availability probe is
NVML's, which does not initialize it.
"""

from __future__ import annotations

import gc
import os
import runpy
import signal
import sys
import traceback
from functools import partial
from pathlib import Path
from typing import NoReturn

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # before torch: is_available() stays fork-safe

import torch  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402
from torch.distributed.launcher.api import elastic_launch  # noqa: E402
from torch.distributed.run import config_from_args, parse_args  # noqa: E402

import container.args  # noqa: E402,F401 - what train.py's main imports, here once for every rank
import container.trainer  # noqa: E402,F401
from container.distributed import runtime  # noqa: E402
from launcher.wire.forked_ranks import RANKS_DIR_ENV, write_rank  # noqa: E402

_WRAPPER = "torch.distributed.elastic.multiprocessing.api"


@record
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.start_method != "fork" or not args.run_path or args.standalone or args.master_port is None:
        raise SystemExit("container.distributed.forked_ranks takes the bootstrap's torchrun options: "
                         "--start-method fork --run-path and a static rendezvous (--master_addr, --master_port)")
    if torch.cuda.is_initialized():
        raise SystemExit("container.distributed.forked_ranks: CUDA was initialized before the ranks were "
                         "forked, so they could not use it; run the job under torchrun")
    if RANKS_DIR_ENV not in os.environ:
        raise SystemExit(f"container.distributed.forked_ranks: {RANKS_DIR_ENV} is not set (the bootstrap sets it)")
    config, _, script_args = config_from_args(args)
    gc.freeze()  # what the agent imported is never collected in a rank: its GC does not walk it
    elastic_launch(config=config, entrypoint=forked_rank)(*script_args)


def forked_rank(script: str, *args: str) -> NoReturn:
    """torch elastic's entry point in each forked rank: the script as `python script args` runs it,
    and the process left as that program leaves it (run_rank's exit, through `_leave`)."""
    leave = partial(_leave, _return_value_queue())
    _start_rank(leave)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = runtime.exit_code(exc)
    except BaseException:  # noqa: BLE001 - failed before run_rank (an import): as Python would report it
        traceback.print_exc()
        code = 1
    leave(code)


def _leave(returned, code: int) -> NoReturn:
    """Leave at once, as a program rank does (container.distributed.runtime.run_rank says why). After
    a success, first the return value torch elastic counts a rank done by: without it the agent
    would wait for ever; handed back by the rank itself, not by returning into torch's wrapper,
    whose wait for the agent's read would hold a rank stopped while the agent shuts down (a stop,
    a failed peer) until it is killed. A failure leaves without one: the exit code is the failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0:
        returned.put(None)  # a SimpleQueue: written to the pipe before put returns, so safe to leave
    os._exit(code)


def _return_value_queue():
    """The queue torch elastic's worker wrapper (`_wrap` in torch.distributed.elastic.multiprocessing.api,
    which calls this rank's entry point) reads this rank's return value from: its local `ret_val_`.
    Found before the run, so a torch whose wrapper differs fails the rank at its start, clearly."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "_wrap" and frame.f_globals.get("__name__") == _WRAPPER):
        frame = frame.f_back
    if frame is None or "ret_val_" not in frame.f_locals:
        raise RuntimeError(f"{_WRAPPER}._wrap, which starts a forked rank, is not as this agent knows it "
                           f"(torch {torch.__version__}); run the script under plain torchrun")
    return frame.f_locals["ret_val_"]


def _start_rank(leave) -> None:
    os.setsid()  # as torchrun's program ranks: a signal to the agent's group does not reach it
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):  # the agent's handlers are not the rank's
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # torchrun's, set after torch was imported here
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    write_rank(Path(os.environ[RANKS_DIR_ENV]), os.getpid(), os.environ)
    runtime.exit_with(leave)


if __name__ == "__main__":
    main()
