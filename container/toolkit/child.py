"""The command a host runs, as the bootstrap runs it: SIGTERM/SIGINT forwarded, its output streamed
(masked) and the end of its stderr kept, the ranks' output streamed from torchrun's log files,
frozen ranks ended (container.toolkit.frozen_ranks), and what it left running once it exited
ended (DRAIN_GRACE_S)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from container.toolkit.agent_template import Template
from container.toolkit.console import log
from container.toolkit.frozen_ranks import FrozenRanks
from container.toolkit.rank_logs import RankLogs
from container.toolkit.script_watch import ScriptWatch
from container.toolkit.stop_traceback import StopTraceback
from launcher.wire import masking

STDERR_TAIL_BYTES = 64 * 1024  # enough for torchrun's failure summary of a full host
# Once the entry process (or torchrun) has exited, its last output may still be in the pipes: read
# for this long; a process it left running that still holds them (a TensorBoard, `nvidia-smi dmon &`)
# is then ended, so a finished job finishes.
DRAIN_GRACE_S = 5.0
LEFTOVER_GRACE_S = 2.0  # SIGTERM to SIGKILL for those leftovers


class Child:
    """The launched command: SIGTERM/SIGINT forwarded to it, its stdout and stderr streamed
    (masked) and the end of its stderr kept, and with `rank_logs` (torchrun's --log-dir) the
    ranks' output streamed from their files.

    It runs in its own session, so a terminal's Ctrl-C reaches it once (through us), and signals
    go to its whole process group. torchrun forwards them to every rank (each rank runs in a
    session of its own) and stops the ranks; a single-process script gets them directly.
    """

    def __init__(self, cmd: list[str], *, cwd: Path, env: dict[str, str], rank_logs: Path | None = None,
                 on_rank_end=None, frozen_alone_s: float | None = None, hang_s: float | None = None,
                 on_hang=None, heartbeats: Path | None = None, template: Template | None = None):
        """`on_rank_end(pid)`: under torchrun, called once with torchrun's pid when its first rank has
        ended while others still run; `frozen_alone_s`: see container.toolkit.frozen_ranks; `hang_s`:
        under torchrun, a script whose ranks neither compute nor write for this long is hung
        (container.toolkit.script_watch; by its beats in `heartbeats` once it sends some): `on_hang(pid,
        silence)` is called with torchrun's pid (to collect stacks) and what did not move, then the command
        is stopped (SIGTERM), and `hung_after` says after how long. `template`: `cmd`, the runtime's agent, is
        forked from the host's preloaded template (Template) rather than started as a program."""
        self.signals: list[int] = []
        self.stderr_tail = b""
        self.piped_bytes = 0
        self._proc: subprocess.Popen | None = None
        self._previous = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)
        }
        # preexec_fn is safe here: this process runs no other thread yet (the pumps start below).
        self._proc = template.start(cmd, cwd, env) if template else subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509
        )
        for signum in self.signals:  # arrived while the process was being started
            self._forward(signum)
        # torchrun's traceback of a stop we forwarded is no news (container.toolkit.stop_traceback)
        quiet = StopTraceback(lambda: bool(self.signals)) if rank_logs else None
        self._pumps = [
            threading.Thread(target=self._copy, args=(self._proc.stdout, sys.stdout.buffer, False), daemon=True),
            threading.Thread(target=self._copy, args=(self._proc.stderr, sys.stderr.buffer, True, quiet),
                             daemon=True),
        ]
        for pump in self._pumps:
            pump.start()
        self._ranks = RankLogs(rank_logs).start() if rank_logs else None
        # Under torchrun (rank_logs): a rank stopped while its peers end is continued, then killed.
        first_end = (lambda: on_rank_end(self._proc.pid)) if on_rank_end else None
        self.frozen = FrozenRanks(self._proc.pid, log, first_end, frozen_alone_s,
                                  agent_env=env).start() if rank_logs else None
        self.watch = ScriptWatch(self._proc.pid, hang_s, rank_logs, lambda: self.piped_bytes,
                                 lambda seconds: self._hung(on_hang),
                                 heartbeats).start() if rank_logs and hang_s else None

    @property
    def hung_after(self) -> float | None:
        return self.watch.hung_after if self.watch else None

    def _hung(self, on_hang) -> None:
        if on_hang is not None:
            on_hang(self._proc.pid, self.watch.silence)
        self._forward(signal.SIGTERM)  # torchrun stops the ranks: SIGTERM, SIGKILL after its shutdown timeout

    def _on_signal(self, signum: int, _frame) -> None:
        self.signals.append(signum)
        if self._proc is not None:
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        try:
            os.killpg(self._proc.pid, signum)
        except ProcessLookupError:  # already gone
            pass

    def _copy(self, src, dst, keep_tail: bool, quiet: StopTraceback | None = None) -> None:
        # Chunks, not lines: progress bars that redraw with \r must show up as they happen. Only
        # a chunk's tail that may begin a secret waits for the next chunk, so a secret cut in two
        # by the pipe is still masked.
        fd = src.fileno()
        masked = masking.StreamMasker(masking.installed())
        while chunk := os.read(fd, 65536):
            self.piped_bytes += len(chunk)
            dst.write(masked.feed(quiet.feed(chunk) if quiet else chunk))
            dst.flush()
            if keep_tail:
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL_BYTES:]
        dst.write(masked.feed(quiet.feed(b"", final=True) if quiet else b"", final=True))
        dst.flush()

    def wait(self) -> int:
        """The entry process's exit code, once it has exited and its output is read (see DRAIN_GRACE_S)."""
        returncode = self._proc.wait()
        if self.frozen:
            self.frozen.stop()
        if self.watch:
            self.watch.stop()
        self._drain()
        if self._ranks:
            self._ranks.stop()
        for pump, pipe in zip(self._pumps, (self._proc.stdout, self._proc.stderr)):
            if not pump.is_alive():  # a pipe still being read is left to the process's exit
                pipe.close()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return returncode


    def _drain(self) -> None:
        """Read the pipes to their end; what still holds them after DRAIN_GRACE_S (processes the
        entry process started and left running) is ended: SIGTERM, then SIGKILL, to its process
        group. One that left the group (a session of its own) is no longer read; the job's
        supervisor ends it with the job's other leftovers."""
        if self._joined(DRAIN_GRACE_S):
            return
        log(f"the entry process exited, but processes it started still hold its output open: ending them "
            f"(process group {self._proc.pid})")
        for signum, grace in ((signal.SIGTERM, LEFTOVER_GRACE_S), (signal.SIGKILL, LEFTOVER_GRACE_S)):
            try:
                # The group outlives its leader while any member runs, so its id names no other process.
                os.killpg(self._proc.pid, signum)
            except ProcessLookupError:
                pass
            if self._joined(grace):
                return
        log("their output is no longer read: a process outside the entry process's group holds it")

    def _joined(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(deadline - time.monotonic(), 0))
        return not any(pump.is_alive() for pump in self._pumps)


def _die_with_parent():
    """Linux: should the bootstrap be SIGKILLed, the child gets SIGTERM (PR_SET_PDEATHSIG), so
    torchrun stops every rank rather than living on without a parent."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None).prctl  # looked up here: the forked child only makes the call
    return lambda: prctl(1, signal.SIGTERM)
