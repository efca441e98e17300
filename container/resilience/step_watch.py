"""The step watchdog: a rank that stops making progress writes its stacks and leaves (docs/faults.md, "Hangs").

A daemon thread in every rank of smlaunch's runtime watches one deadline at a time:

- initialization, from `start` until the first step completes: `init_timeout`;
- each step after it: `step_timeout`, or by default max(STEP_TIMEOUT_FLOOR_S, STEP_TIMEOUT_MEDIANS
  x the median of the last MEDIAN_WINDOW steps); before any step has been timed (the first step's
  time cannot be told from initialization's) the step after the first still gets `init_timeout`;
- a checkpoint save or a validation pass (`section`): timed on its own, against `init_timeout`
  (they move as much data as loading does), and left out of the step times, so neither a long
  synchronous save trips the step timeout nor raises the median.

On expiry the rank writes every thread's Python stacks with a header into
`diagnostics/attempt-<N>/rank-<R>.txt` of its output data directory, the Flight Recorder's trace
where the bootstrap asked for it, a failure record for the bootstrap (launcher.wire.faults),
logs one line, and leaves with os._exit(EXIT_HUNG). It first waits HANG_EXIT_GRACE_S, so that the
peers, whose deadlines expire at about the same moment, write their stacks while the job still
stands; a rank waiting in a collective (a victim) waits VICTIM_EXTRA_S longer, so that the rank
which is not (the likely cause) exits first and torchrun names it as the root cause.

From the expiry on, the rank is leaving: its main thread, should the hang end meanwhile (a frozen
peer continued), waits at its next step's end or section's start for the exit instead of training
on. Another step would not be in the failure record, and a checkpoint saved then would resume the
restart past the step the failure names.

A hang that holds the GIL (a C extension looping without releasing it) stops this thread too; the
peers' watchdogs still fire, and SIGUSR1 (`stacks_on_signal`: faulthandler, which needs no GIL)
still gets its stacks.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d

from container.resilience import attempt
from launcher.wire import diagnostics, faults, masking
from launcher.wire.faults import EXIT_HUNG
from launcher.wire.training.hyperparameters import (
    INIT_TIMEOUT_DEFAULT_S,
    STEP_TIMEOUT_FLOOR_S,
    STEP_TIMEOUT_MEDIANS,
    TrainingHyperparameters,
)

log = logging.getLogger("smlaunch")

MEDIAN_WINDOW = 100  # the latest steps: the median follows a run whose steps change (sequence length, MoE)
HANG_EXIT_GRACE_S = 3.0
VICTIM_EXTRA_S = 2.0
# torch reads the first of these that is set (getCvarString): the Flight Recorder's dump file prefix
FLIGHT_RECORDER_FILE_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
NO_FLIGHT_RECORDER = ("not dumped (no Flight Recorder file variable in this rank's environment, or the dump failed: "
                      "see the log)")


class StepTimeout(RuntimeError):
    """What the failure record of a hung rank names (launcher.wire.faults.RankFailure.exception:
    HUNG_EXCEPTION, by which the bootstrap's report says the rank hung)."""


@dataclass(frozen=True)
class Limits:
    init_s: float | None  # None: not watched
    step_s: float | None  # None: derived from the step times
    step_off: bool = False

    @classmethod
    def of(cls, hp: TrainingHyperparameters) -> Limits:
        init = INIT_TIMEOUT_DEFAULT_S if hp.init_timeout is None else hp.init_timeout
        return cls(init_s=init or None, step_s=hp.step_timeout or None, step_off=hp.step_timeout == 0)

    def init(self, what: str = "initialization") -> tuple[float | None, str]:
        return self.init_s, f"init_timeout {self.init_s:g} s, for {what}" if self.init_s else "off"

    def step(self, times: list[float]) -> tuple[float | None, str]:
        """The limit of the next step and where it comes from, given the steps timed so far."""
        if self.step_off:
            return None, "off"
        if self.step_s is not None:
            return self.step_s, f"step_timeout {self.step_s:g} s, set by the job"
        if not times:
            return self.init("the step after the first, none timed yet")
        median = statistics.median(times)
        limit = max(STEP_TIMEOUT_FLOOR_S, STEP_TIMEOUT_MEDIANS * median)
        return limit, (f"step_timeout by default: max({STEP_TIMEOUT_FLOOR_S} s, {STEP_TIMEOUT_MEDIANS} x "
                       f"median step {median:.3g} s of the last {len(times)})")


@dataclass(frozen=True)
class Deadline:
    at: float | None  # the clock's time; None: nothing watched now
    since: float
    what: str  # "initialization", "step 7", "checkpoint save after step 6"
    limit: float | None
    source: str


class StepWatch:
    """One rank's watchdog. `clock` and `leave` are the tests' seams (time.monotonic, os._exit)."""

    def __init__(self, limits: Limits, diag_dir: Path, rank: int, world: int, host: str,
                 clock: Callable[[], float] = time.monotonic, leave: Callable[[int], None] = os._exit,
                 grace_s: float = HANG_EXIT_GRACE_S):
        self.limits, self.diag_dir, self.rank, self.world, self.host = limits, diag_dir, rank, world, host
        self.clock, self.leave, self.grace_s = clock, leave, grace_s
        self.times: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self.step: int | None = None  # the last step completed
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stopped = threading.Event()
        self._declared = threading.Event()  # a hang was declared: the rank is leaving
        self._left = threading.Event()  # `leave` returned: only a test's does
        now = clock()
        self.deadline = self._deadline(now, "initialization", *limits.init())
        self._thread = threading.Thread(target=self._run, name="smlaunch-step-watch", daemon=True)

    def start(self) -> StepWatch:
        self._thread.start()
        return self

    @staticmethod
    def _deadline(now: float, what: str, limit: float | None, source: str) -> Deadline:
        return Deadline(None if limit is None else now + limit, now, what, limit, source)

    def _set(self, deadline: Deadline) -> None:
        with self._lock:
            self.deadline = deadline
        self._changed.set()

    def _hold_if_hung(self) -> None:
        """The main thread, between steps: once a hang is declared, wait for the rank's exit, and
        leave with its code should `leave` return (a test's)."""
        if self._declared.is_set():
            self._left.wait()
            raise SystemExit(EXIT_HUNG)

    def step_done(self, step: int) -> None:
        """`step` completed: its time (since the last step or section ended) joins the median."""
        self._hold_if_hung()
        now = self.clock()
        if self.step is not None:
            self.times.append(now - self.deadline.since)
        self.step = step
        self._set(self._deadline(now, f"step {step + 1}", *self.limits.step(list(self.times))))

    @contextmanager
    def section(self, what: str) -> Iterator[None]:
        """A checkpoint save or validation pass, timed against init_timeout; the next step's clock
        starts when it ends."""
        self._hold_if_hung()
        after = f" after step {self.step}" if self.step is not None else ""
        self._set(self._deadline(self.clock(), what + after, *self.limits.init(what)))
        try:
            yield
        finally:
            now = self.clock()
            nxt = "initialization" if self.step is None else f"step {self.step + 1}"
            limits = self.limits.init() if self.step is None else self.limits.step(list(self.times))
            self._set(self._deadline(now, nxt, *limits))

    def stop(self) -> None:
        self._stopped.set()
        self._changed.set()

    def expired(self, now: float) -> Deadline | None:
        with self._lock:
            deadline = self.deadline
        return deadline if deadline.at is not None and now >= deadline.at else None

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._changed.clear()
            due = self.expired(self.clock())
            if due is not None:
                self._expire(due)
                return
            at = self.deadline.at
            self._changed.wait(None if at is None else max(at - self.clock(), 0.0))

    def _expire(self, due: Deadline) -> None:
        self._declared.set()
        waited = self.clock() - due.since
        reason = f"{due.what} did not complete within {due.limit:g} s ({due.source}); waited {waited:.1f} s"
        main = threading.main_thread().ident
        victim = _waiting_in_collective(sys._current_frames().get(main))
        trace = dump_flight_recorder(self.rank)
        written = write_stacks(self.diag_dir, self.rank, self.world, self.host, reason=reason,
                               main_thread=f"0x{main:016x}", last_completed_step=str(self.step),
                               flight_recorder=str(trace) if trace else NO_FLIGHT_RECORDER,
                               **diagnostics.nccl_fields(os.environ, nccl_version()))
        attempt.record_failure(StepTimeout(reason), in_collective=victim)
        log.error("rank %d: %s; stacks in %s%s; %s; leaving with exit code %d", self.rank, reason, written,
                  f", Flight Recorder trace in {trace}" if trace else "",
                  "its main thread waits in a collective" if victim else "its main thread is not in a collective",
                  EXIT_HUNG)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        time.sleep(self.grace_s + (VICTIM_EXTRA_S if victim else 0.0))
        self.leave(EXIT_HUNG)
        self._left.set()


def _waiting_in_collective(frame) -> bool:
    """The main thread's innermost frame waits in torch.distributed (the diagnosis's own rule)."""
    if frame is None:
        return False
    return diagnostics.Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name).waiting


def nccl_version() -> str:
    """The NCCL this rank's torch runs, or why it runs none."""
    if not torch.cuda.is_available():
        return "none in this process (no CUDA device: gloo)"
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def write_stacks(diag_dir: Path, rank: int, world: int | None, host: str, **fields: str) -> Path | str:
    """Append a header and every thread's stacks to this rank's file; on an OSError, to stderr (said).
    The header goes through the job's masker: its fields carry the rank's settings."""
    header = masking.installed()(diagnostics.stacks_header(rank, world, host, os.getpid(), **fields))
    path = diagnostics.rank_file(diag_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(header)
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        return path
    except OSError as exc:
        log.error("rank %d: cannot write %s (%s): the stacks follow on stderr", rank, path, exc)
        sys.stderr.write(header)
        sys.stderr.flush()
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        return "stderr"


def dump_flight_recorder(rank: int) -> Path | None:
    """The Flight Recorder's trace (what this rank's process groups ran, started and finished) to
    the file torch would dump to on a collective timeout, where the bootstrap set its prefix
    (container/toolkit/diagnostics.flight_recorder_environment); None where it did not, or where
    torch's own dump came first."""
    prefix = next((os.environ[v] for v in FLIGHT_RECORDER_FILE_VARIABLES if os.environ.get(v)), None)
    if prefix is None:
        return None
    path = Path(prefix + str(rank))
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(c10d._dump_fr_trace())
        return path
    except (OSError, RuntimeError) as exc:
        log.error("rank %d: could not dump the Flight Recorder's trace to %s: %s", rank, path, exc)
        return None


def stacks_on_signal() -> None:
    """SIGUSR1 writes every thread's stacks to this rank's stderr (its log file under torchrun),
    from faulthandler's C handler, so a rank blocked in a collective or holding the GIL answers too;
    the bootstrap asks with it (container/toolkit/diagnostics.collect_stacks)."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


# --- the trainer's calls: one watch per rank process ------------------------------------------

_current: StepWatch | None = None


def start(hp: TrainingHyperparameters, output_data: Path) -> StepWatch:
    global _current
    stop()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    host = os.environ.get("CURRENT_HOST") or os.environ.get("SM_CURRENT_HOST") or socket.gethostname()
    diag_dir = diagnostics.attempt_dir(output_data, faults.attempt())
    _current = StepWatch(Limits.of(hp), diag_dir, rank, world, host).start()
    return _current


def step_done(step: int) -> None:
    if _current is not None:
        _current.step_done(step)


@contextmanager
def section(what: str) -> Iterator[None]:
    if _current is None:
        yield
        return
    with _current.section(what):
        yield


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
    _current = None
