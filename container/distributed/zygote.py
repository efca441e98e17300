"""A host's agent template: smlaunch's runtime imported once for all of a bootstrap's attempts.

torchrun's agent for the runtime (container.distributed.forked_ranks) imports torch and the runtime so
that its ranks fork with them; each attempt's agent used to be a fresh program, so a restart imported
it all again (~2.3 CPU s per host here, most of a local restart's start-up: BENCHMARKS.md). The
bootstrap starts this process once (`python -u -m container.distributed.zygote FD`, FD one end of a
Unix socket); it imports what the agent imports, then, for each attempt, forks that attempt's agent
as the bootstrap would have started `python -u -m container.distributed.forked_ranks ARGS`: those
arguments, the attempt's environment and working directory, its standard output and error the
bootstrap's pipes (passed over the socket), standard input /dev/null, a session of its own.

The protocol (container.toolkit.agent_template is the bootstrap's side): the bootstrap sends a
request, a 4-byte length with the two pipes' write ends attached (SCM_RIGHTS), then that many bytes
of JSON ({"argv", "env", "cwd"}); this process answers {"pid": N} once the agent is in its own
session (so a signal to its group reaches it), then {"returncode": R} when it has exited (R as
subprocess reports it: -N for a signal). One agent at a time (attempts follow each other), so it
forks with no other thread running. It ends when the bootstrap closes the socket, and ignores
SIGTERM, SIGINT and SIGHUP: what stops a job (Slurm's scancel signals every process of the step)
stops the agent and its ranks, which save a checkpoint, while the template stays to hand the
bootstrap the agent's exit code. A bootstrap killed outright takes it along (PR_SET_PDEATHSIG:
SIGKILL), and the agent with it (its own death signal: SIGTERM, as torchrun's from the bootstrap).

What a module read from the environment at import is the first attempt's: smlaunch's runtime reads
it when it runs (the attempt's number, its fault and heartbeat directories, the Flight Recorder's
files are each attempt's own), and what torch reads at import (NVML's CUDA probe) is set again.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import traceback
from typing import NoReturn

from container.distributed import forked_ranks  # the import this process exists for
from container.distributed.runtime import exit_code
from launcher.wire.forked_ranks import TEMPLATE_HEADER as HEADER

_PDEATHSIG = 1  # prctl's PR_SET_PDEATHSIG
_NVML = "PYTORCH_NVML_BASED_CUDA_CHECK"  # forked_ranks sets it before torch: the agent must not initialize CUDA
_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # by the template; the agent gets a program's handlers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -u -m container.distributed.zygote FD (the bootstrap starts it)", file=sys.stderr)
        return 2
    for signum in _IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)
    sock = socket.socket(fileno=int(argv[0]))
    while (request := receive(sock)) is not None:
        fields, pipes = request
        pid = _fork_agent(fields, pipes, sock)
        _answer(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _answer(sock, {"returncode": os.waitstatus_to_exitcode(status)})
    return 0


def receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """The next request (its fields and the pipes' write ends), None once the bootstrap has closed the socket."""
    head, fds, _, _ = socket.recv_fds(sock, HEADER.size, 2)
    if not head:
        return None
    head += _exactly(sock, HEADER.size - len(head))
    fields = json.loads(_exactly(sock, HEADER.unpack(head)[0]))
    if len(fds) != 2:
        raise RuntimeError(f"a request came with {len(fds)} file descriptors, not the agent's stdout and stderr")
    return fields, fds


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise RuntimeError("the bootstrap closed the socket in the middle of a request")
        data += chunk
    return data


def _answer(sock: socket.socket, fields: dict) -> None:
    sock.sendall(json.dumps(fields).encode() + b"\n")


def _fork_agent(fields: dict, pipes: list[int], sock: socket.socket) -> int:
    """Fork the attempt's agent; its pid once it runs in its own session."""
    ready_r, ready_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        _agent(fields, pipes, sock, ready_w)
    for fd in (*pipes, ready_w):  # the agent holds the pipes now: their end of file is its and its ranks'
        os.close(fd)
    os.read(ready_r, 1)  # end of file: the agent has its session and its streams (or has died trying)
    os.close(ready_r)
    return pid


def _agent(fields: dict, pipes: list[int], sock: socket.socket, ready: int) -> NoReturn:
    """In the forked child: become the attempt's agent, run it, and leave with its exit code."""
    code = 1
    try:
        parent = os.getppid()
        os.setsid()
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent:  # the template died before the death signal was set
            os._exit(1)
        sock.close()
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (pipes[0], 1), (pipes[1], 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.close(ready)
        os.chdir(fields["cwd"])
        os.environ.clear()
        os.environ.update(fields["env"])
        os.environ.setdefault(_NVML, "1")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = [forked_ranks.__file__, *fields["argv"]]
        forked_ranks.main(fields["argv"])
        code = 0
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:  # noqa: BLE001 - reported as Python reports what ends a program
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def die_with_parent(signum: int) -> None:
    """Linux: `signum` to this process when its parent dies (elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PDEATHSIG, signum)


if __name__ == "__main__":
    sys.exit(main())
