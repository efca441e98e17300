"""The host's agent template, the bootstrap's side of container.distributed.zygote (which says why and
how): started with the first attempt of smlaunch's runtime, each attempt's agent forked from it and used
as the bootstrap uses a Popen (container.toolkit.child), ended when the bootstrap's attempts are over.
Where the process runner started one template for the job's hosts (launcher.wire.forked_ranks.TEMPLATE_ENV
names it), the bootstrap connects to that one instead, and starts its own only if it cannot (saying so)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from container.toolkit.console import log
from launcher.wire.forked_ranks import TEMPLATE_HEADER as HEADER
from launcher.wire.proc_stat import parent_and_state

TEMPLATE_EXIT_S = 10.0  # the template's exit once its socket is closed (it holds no agent by then)


class Template:
    """The host's agent template (container.distributed.zygote), started at the first `start` and kept
    for the bootstrap's later attempts: each attempt's runtime agent is forked from it, the runtime
    imported once. `close` ends it."""

    AGENT = ("-u", "-m", "container.distributed.forked_ranks")  # after the interpreter: what it forks

    def __init__(self, shared: str | None = None) -> None:
        """`shared`: the name of the job's template (its abstract Unix socket) to connect to."""
        self._shared = shared
        self._proc: subprocess.Popen | None = None  # a template of this host's own
        self._sock: socket.socket | None = None
        self._replies = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> AgentProcess:
        """The agent of `cmd` (`python -u -m container.distributed.forked_ranks ARGS`), started in `cwd`
        with `env`, its stdout and stderr piped here; a template that has died is started again."""
        if tuple(cmd[1:1 + len(self.AGENT)]) != self.AGENT:
            raise ValueError(f"the agent template starts {' '.join(self.AGENT)} only, not {cmd[:4]}")
        if self._sock is None or (self._proc is not None and self._proc.poll() is not None):
            self._open(cwd, env)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        body = json.dumps({"argv": cmd[1 + len(self.AGENT):], "env": env, "cwd": str(cwd)}).encode()
        try:
            socket.send_fds(self._sock, [HEADER.pack(len(body))], [out_w, err_w])
            self._sock.sendall(body)
        finally:
            os.close(out_w)
            os.close(err_w)
        pid = self._reply("pid")
        if pid is None:
            for fd in (out_r, err_r):
                os.close(fd)
            ended = self._ended()
            self.close()  # the next attempt opens a template again
            if self._proc is None and self._shared:  # its import failed, say: this host's own shows why here
                log(f"{ended} before it started the agent (its log: logs/agent-template.log): starting this "
                    "host's own")
                self._shared = None
                return self.start(cmd, cwd, env)
            raise RuntimeError(f"{ended} before it started the agent; its output above says why")
        return AgentProcess(pid, os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0),
                            lambda: self._returncode(pid))

    def _open(self, cwd: Path, env: dict[str, str]) -> None:
        """The job's template where there is one and it answers, else one of this host's own."""
        self.close()
        if self._shared:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect("\0" + self._shared)
            except OSError as exc:
                sock.close()
                log(f"the job's agent template ({self._shared}) does not answer ({exc}): starting this host's own")
                self._shared = None
            else:
                self._sock, self._replies = sock, sock.makefile("rb")
                return
        self._spawn(cwd, env)

    def _spawn(self, cwd: Path, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair()
        # its own session: a terminal's Ctrl-C to the bootstrap's group does not end it mid-job
        self._proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "container.distributed.zygote", str(theirs.fileno())], cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()], start_new_session=True,
        )  # it sets its own death signal; a bootstrap gone before that closed the socket, which ends it
        theirs.close()
        self._sock, self._replies = ours, ours.makefile("rb")

    def _reply(self, key: str) -> int | None:
        """The template's next answer, None if it has exited."""
        line = self._replies.readline()
        return json.loads(line)[key] if line else None

    def _returncode(self, pid: int) -> int:
        """The agent's exit code; if the template died first (its agent then got SIGTERM: PR_SET_PDEATHSIG),
        once the agent is gone, -SIGTERM."""
        code = self._reply("returncode")
        if code is not None:
            return code
        log(f"{self._ended()} while agent {pid} ran: the agent got SIGTERM with it")
        self.close()  # the next attempt opens a template again
        while (stat := parent_and_state(pid)) and stat[1] not in ("Z", "X"):
            time.sleep(0.1)
        return -signal.SIGTERM

    def _ended(self) -> str:
        if self._proc is None:
            return f"the job's agent template ({self._shared}) ended this host's connection"
        return f"the host's agent template (container.distributed.zygote) exited with code {self._proc.wait()}"

    def close(self) -> None:
        """End the template (end of file on its socket) and wait for it; of the job's, this host's connection."""
        if self._sock is not None:
            self._replies.close()
            self._sock.close()
            self._sock = self._replies = None
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=TEMPLATE_EXIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


class AgentProcess:
    """An agent forked from the template, as the bootstrap uses a Popen: its pid (its session's), its
    stdout and stderr, and `wait`, its exit code as subprocess reports one (-N for a signal)."""

    def __init__(self, pid: int, stdout, stderr, returncode):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self._returncode = returncode
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self._returncode()
        return self.returncode

