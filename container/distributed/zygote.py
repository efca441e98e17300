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

A local job's simulated hosts share one (`--listen NAME`, an abstract Unix socket the process runner
names in each bootstrap's environment: launcher.wire.forked_ranks.TEMPLATE_ENV): at the first
bootstrap's request it becomes (execve) `--serve` in that request's environment and directory, so it
imports the runtime once as that host's own template would (from the job's code, `_smlaunch/`), then
forks a handler for that bootstrap and each that connects after it (the same user's only), which
serves it as the host's own template does; a handler whose bootstrap is gone (end of file on its
socket) leaves, and its agent gets SIGTERM. An
agent forked for another host gets its own PYTHONPATH on sys.path; the runtime's modules, imported
already, are the first host's copy of the job's code (the same files). /proc shows such an agent the
template's environment: the bootstrap reads its ranks' variables with the environment it gave the
agent (launcher.wire.forked_ranks.process_environ), never from there.
"""

# Imports inside functions: the runtime, which this process exists to import once, is imported in the
# environment it is for (a local job's template learns it from the first host's request).
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import sys
import traceback
from typing import NoReturn

from container.uncollected import uncollected
from launcher.wire.forked_ranks import TEMPLATE_HEADER as HEADER

_PDEATHSIG = 1  # prctl's PR_SET_PDEATHSIG
_NVML = "PYTORCH_NVML_BASED_CUDA_CHECK"  # forked_ranks sets it before torch: the agent must not initialize CUDA
_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # by the template; the agent gets a program's handlers
_FIRST_REQUEST_S = 10.0  # a bootstrap sends its request as it connects


_runtime = None  # container.distributed.forked_ranks once imported: the import this process exists for
_paths: list[str] = []  # the PYTHONPATH it was imported with (an agent of another host gets its own)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--listen":
        return _listen(argv[1])
    if len(argv) == 2 and argv[0] == "--serve":
        return _serve_hosts(argv[1])
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -u -m container.distributed.zygote FD | --listen NAME (a bootstrap or the process "
              "runner starts it)", file=sys.stderr)
        return 2
    _as_template()  # with the bootstrap
    _import_runtime()  # the bootstrap started this process with the agent's environment and directory
    _serve(socket.socket(fileno=int(argv[0])))
    return 0


def _as_template() -> None:
    """What every template is: deaf to a stop's signals (the agent's exit code is still to be handed
    over), and gone at once with its parent (the bootstrap, or the job's supervisor)."""
    for signum in _IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)


def _serve(sock: socket.socket, request: tuple[dict, list[int]] | None = None) -> None:
    """Fork an agent for each request (the first one given, else read), until the bootstrap closes the socket."""
    while (request := request or receive(sock)) is not None:
        fields, pipes = request
        pid = _fork_agent(fields, pipes, sock)
        _answer(sock, {"pid": pid})
        code = _wait(pid, sock)
        if code is None:  # the bootstrap is gone: nobody reads the code; leaving sends the agent its SIGTERM
            os._exit(1)
        _answer(sock, {"returncode": code})
        request = None


def _wait(pid: int, sock: socket.socket) -> int | None:
    """The agent's exit code, as subprocess reports one; None once the bootstrap has closed the socket."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: wait for the agent alone
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try:
        watched = [pidfd, sock]
        while True:
            ready, _, _ = select.select(watched, [], [])
            if pidfd in ready:
                return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            if not sock.recv(1, socket.MSG_PEEK):
                return None
            watched = [pidfd]  # bytes mid-attempt are no request of the protocol's: the next read takes them
    finally:
        os.close(pidfd)


def _listen(name: str) -> int:
    """The template of a local job's hosts, before it imports: the first bootstrap's request decides
    how (its environment and directory: the job's code, whose `_smlaunch/` holds the runtime it was
    submitted with), so this process becomes `--serve` with them (execve: the same pid, parent and
    socket) and imports the runtime exactly as a host's own template would."""
    _as_template()  # with the job's supervisor
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen()
    conn, (fields, pipes) = _next_request(server)
    first = os.memfd_create("request")  # the request's fields, for the program this one becomes
    os.write(first, json.dumps(fields).encode())
    os.lseek(first, 0, os.SEEK_SET)
    fds = [server.fileno(), conn.fileno(), *pipes, first]
    for fd in fds:
        os.set_inheritable(fd, True)
    os.chdir(fields["cwd"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-u", "-m", __spec__.name, "--serve", ",".join(map(str, fds))],
              fields["env"])


def _serve_hosts(fds: str) -> int:
    """`--serve`: the template of a local job's hosts, in the first request's environment: import the
    runtime, then fork a handler for that request's bootstrap and for each that connects after it."""
    _as_template()  # as the program it now is (execve kept both, but this program's own start says so)
    listening, conn, out, err, first = map(int, fds.split(","))
    for fd in (listening, conn, out, err, first):
        os.set_inheritable(fd, False)
    with os.fdopen(first, "rb") as request:
        fields = json.loads(request.read())
    _import_runtime()
    server = socket.socket(fileno=listening)
    _hand_over(server, socket.socket(fileno=conn), (fields, [out, err]))
    while True:
        _hand_over(server, *_next_request(server))


def _next_request(server: socket.socket) -> tuple[socket.socket, tuple[dict, list[int]]]:
    """The next bootstrap's connection and its first request (a client of another user, or that is no
    bootstrap, is closed and not served)."""
    while True:
        conn, _ = server.accept()
        _reap()
        try:
            conn.settimeout(_FIRST_REQUEST_S)  # a client that connects and says nothing does not hold the others
            request = receive(conn) if same_user(conn) else None
            conn.settimeout(None)
        except (OSError, RuntimeError, ValueError):
            request = None
        if request is not None:
            return conn, request
        conn.close()


def _hand_over(server: socket.socket, conn: socket.socket, request: tuple[dict, list[int]]) -> None:
    """Fork the bootstrap's handler, which serves it from `request` on as a host's own template does."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        code = 1
        try:
            server.close()
            _serve(conn, request)
            code = 0
        except BaseException:  # noqa: BLE001 - never back into the template's loop
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    conn.close()
    for fd in request[1]:
        os.close(fd)


def same_user(conn: socket.socket, uid: int | None = None) -> bool:
    """Whether the peer is a process of this user (`uid`): an abstract socket has no permissions, so only
    such a process is served."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder) == (os.getuid() if uid is None else uid)


def _reap() -> None:
    """Collect the handlers that have ended (their bootstraps are gone)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _import_runtime() -> None:
    """Import the agent's runtime, as `python -m container.distributed.forked_ranks` started with this
    process's environment and working directory would, without the cyclic collector (container.uncollected)."""
    global _runtime, _paths
    _paths = _python_path(os.environ)
    with uncollected():
        from container.distributed import forked_ranks
    _runtime = forked_ranks


def _python_path(env) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _use_paths(fields: dict) -> None:
    """An agent for another host: its PYTHONPATH (its code directory) on sys.path in place of the first's."""
    theirs = _python_path(fields["env"])
    if theirs != _paths:
        kept = [p for p in sys.path[1:] if p not in _paths]
        sys.path[:] = [fields["cwd"], *theirs, *kept]  # as Python starts a -m module in the request's directory


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
        _use_paths(fields)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = [_runtime.__file__, *fields["argv"]]
        _runtime.main(fields["argv"])
        code = 0
    except SystemExit as exc:
        from container.distributed.runtime import exit_code  # imported already, with the runtime

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
