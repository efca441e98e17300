"""What the bootstrap collects from a host's ranks before they are killed (docs/faults.md, "Hangs").

- `flight_recorder_environment`: the variables that make torch's Flight Recorder record every
  process group's collectives and dump them into the job's diagnostics on a collective timeout
  (the step watchdog dumps it too: container/resilience/step_watch.py).
- `collect_stacks`: every live rank of one torchrun writes its Python stacks (SIGUSR1, which
  smlaunch's runtime hands to faulthandler), and they are copied with the end of each rank's
  stderr, and py-spy's native view where py-spy is installed, into `rank-<R>.txt`, masked as the
  job's log is (launcher.wire.masking): the stderr files are the ranks' raw output.
- `summarize`: which rank hung and where (launcher.wire.diagnostics), into summary.txt.

Only ranks that catch SIGUSR1 are signalled (/proc/<pid>/status, SigCgt): its default action
ends a process, and a user's own script, or a rank still importing torch, has no handler.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from container.toolkit.frozen_ranks import children
from container.toolkit.rank_logs import stderr_file
from launcher.wire import diagnostics, masking
from launcher.wire.forked_ranks import process_environ
from launcher.wire.proc_stat import PROC

STACKS_WAIT_S = 2.0  # faulthandler writes within milliseconds; a loaded host gets more
LOG_TAIL_LINES = 50
PY_SPY_TIMEOUT_S = 30.0
FLIGHT_RECORDER_ENTRIES = "2000"  # torch's own default since 2.6; older images recorded nothing
# The Flight Recorder's variables were renamed in torch 2.8, which reads both names (the new one
# first) and warns on every rank of every job that sets the old one; before 2.8 only the old names
# are read (the strings of libtorch_cpu of torch 2.7.1 and 2.8.0).
RENAMED_IN = (2, 8)
_NEW_NAMES = {"buffer": "TORCH_FR_BUFFER_SIZE", "file": diagnostics.FLIGHT_RECORDER_FILES[0]}
_OLD_NAMES = {"buffer": "TORCH_NCCL_TRACE_BUFFER_SIZE", "file": diagnostics.FLIGHT_RECORDER_FILES[1]}


def torch_version() -> tuple[int, int] | None:
    """(major, minor) of the torch this Python (so torchrun and the ranks) imports, read from its
    metadata: importing torch would cost the bootstrap seconds. None where it cannot be read."""
    try:
        found = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return None
    return (int(found[1]), int(found[2])) if found else None


def flight_recorder_environment(diag_dir: Path, environ: dict[str, str] | None = None,
                                torch: tuple[int, int] | None = None) -> dict[str, str]:
    """The Flight Recorder's variables to add to the ranks' environment: a trace buffer, a dump on a
    collective timeout, and the dump files' prefix in `diag_dir`/flight_recorder (created here:
    torch writes into it but creates nothing). A variable the job set, under either name (`environ`,
    default this process's), is left out, so the job's own value wins. The names are those `torch`
    (default: `torch_version()`) reads; both where its version is unknown."""
    environ = os.environ if environ is None else environ
    names = _names(torch or torch_version())
    out = {}
    if not _job_sets(environ, "buffer"):
        out.update({n["buffer"]: FLIGHT_RECORDER_ENTRIES for n in names})
    if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in environ:  # not renamed
        out["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    if not _job_sets(environ, "file"):
        directory = Path(diag_dir) / diagnostics.FLIGHT_RECORDER_DIR
        directory.mkdir(parents=True, exist_ok=True)
        out.update({n["file"]: str(directory / diagnostics.FLIGHT_RECORDER_PREFIX) for n in names})
    return out


def _names(torch: tuple[int, int] | None) -> list[dict[str, str]]:
    if torch is None:  # the ranks' torch reads one of them
        return [_NEW_NAMES, _OLD_NAMES]
    return [_NEW_NAMES] if torch >= RENAMED_IN else [_OLD_NAMES]


def _job_sets(environ, key: str) -> bool:
    return any(names[key] in environ for names in (_NEW_NAMES, _OLD_NAMES))


@dataclass
class _Rank:
    pid: int
    rank: int
    local_rank: int
    state: str
    stderr: Path | None
    offset: int = 0  # the stderr file's size before the signal: the stacks follow it
    signalled: bool = False
    environ: dict[str, str] = field(default_factory=dict)  # its environment, as /proc shows it


def collect_stacks(torchrun_pid: int, log_dir: Path, diag_dir: Path, log: Callable[[str], None],
                   host: str, reason: str = "on the bootstrap's request", wait_s: float = STACKS_WAIT_S,
                   agent_env: dict[str, str] | None = None) -> list[Path]:
    """Ask every live rank (child) of `torchrun_pid` for its stacks and write, per rank,
    `diag_dir`/rank-<R>.txt: a header, the stacks, py-spy's dump (or why there is none) and the last
    LOG_TAIL_LINES of its stderr (torchrun's `--log-dir` layout under `log_dir`). Returns the files."""
    ranks = []
    for pid, state in sorted(children(torchrun_pid).items()):
        environ = process_environ(pid, agent_env)  # agent_env: the environment torchrun was given
        if "RANK" not in environ:  # not a rank torchrun started (or it is already gone)
            continue
        local_rank = int(environ.get("LOCAL_RANK", "0"))
        path = stderr_file(log_dir, local_rank)
        ranks.append(_Rank(pid, int(environ["RANK"]), local_rank, state, path,
                           path.stat().st_size if path and path.exists() else 0, environ=environ))
    for rank in ranks:
        if rank.state != "T" and _catches(rank.pid, signal.SIGUSR1):
            try:
                os.kill(rank.pid, signal.SIGUSR1)
                rank.signalled = True
            except ProcessLookupError:
                pass
    if any(r.signalled for r in ranks):
        time.sleep(wait_s)
    py_spy = shutil.which("py-spy")
    nccl = nccl_package_version()  # once: it reads every installed package's metadata
    written = [_write_rank(rank, diag_dir, host, reason, py_spy, nccl) for rank in ranks]
    log(f"{host}: the stacks of {len(written)} rank(s) are in {diag_dir}" if written
        else f"{host}: no live rank to collect stacks from")
    return written


def _catches(pid: int, signum: int) -> bool:
    """The process has a handler for `signum` (SigCgt of /proc/<pid>/status)."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def nccl_package_version() -> str | None:
    """The NCCL of the pip wheel torch loads (nvidia-nccl-cu12, ...), read from its metadata: the
    bootstrap does not import torch. None where NCCL is not a wheel here (a CPU build, or an image's
    own NCCL: the rank's own file names it, container.resilience.step_watch)."""
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("nvidia-nccl"):
            return f"{dist.version} ({name})"
    return None


def _nccl_lines(rank: _Rank, nccl: str | None) -> dict[str, str]:
    """The rank's NCCL lines (`nccl`: nccl_package_version's), and where its Flight Recorder dump is
    (torch writes it on a collective timeout, to the prefix the bootstrap set, and the rank's step
    watchdog on a hang)."""
    lines = diagnostics.nccl_fields(rank.environ, nccl)
    prefix = next((rank.environ[n["file"]] for n in (_NEW_NAMES, _OLD_NAMES) if rank.environ.get(n["file"])), None)
    if prefix:
        dump = Path(prefix + str(rank.rank))
        lines["flight_recorder"] = str(dump) if dump.exists() else f"{dump} (not written by the time of the stacks)"
    else:
        lines["flight_recorder"] = "not recorded: the job set no Flight Recorder file variable"
    return lines


def _write_rank(rank: _Rank, diag_dir: Path, host: str, reason: str, py_spy: str | None,
                nccl: str | None) -> Path:
    if rank.signalled:
        stacks = _read_from(rank.stderr, rank.offset) or "(no stacks were written within the wait)\n"
        how = "SIGUSR1"
    else:
        why = "stopped (SIGSTOP?): it runs no handler" if rank.state == "T" else (
            "it does not catch SIGUSR1 (not smlaunch's runtime, or still starting)")
        stacks, how = f"(not asked: {why})\n", "none"
    header = diagnostics.stacks_header(rank.rank, None, host, rank.pid, reason=reason, stacks=how,
                                       local_rank=str(rank.local_rank), **_nccl_lines(rank, nccl))
    before = _read_from(rank.stderr, 0, end=rank.offset).splitlines()[-LOG_TAIL_LINES:]
    text = (header + stacks + _py_spy(rank.pid, py_spy)
            + f"--- the last {len(before)} lines of its stderr ({rank.stderr or 'no stderr file'}) ---\n"
            + "".join(line + "\n" for line in before))
    # The stderr file is the rank's raw output (the job log's copy is masked on its way out): what
    # the script printed between the stacks, or before them, may hold the job's secrets.
    text = masking.installed()(text)
    path = diagnostics.rank_file(diag_dir, rank.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
    return path


def _read_from(path: Path | None, start: int, end: int | None = None) -> str:
    if path is None:
        return ""
    try:
        with path.open("rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(max(end - start, 0))
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _py_spy(pid: int, py_spy: str | None) -> str:
    if py_spy is None:
        return ("--- py-spy: not found on PATH, so no native frames (C++, CUDA, NCCL); install py-spy in the "
                "image to have them ---\n")
    try:
        done = subprocess.run([py_spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=PY_SPY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"--- py-spy dump --native --pid {pid} failed: {exc} ---\n"
    status = "" if done.returncode == 0 else f" (exit code {done.returncode})"
    return f"--- py-spy dump --native --pid {pid}{status} ---\n{done.stdout}{done.stderr}"


def summarize(diag_dir: Path, log: Callable[[str], None]) -> str | None:
    """Which rank hung and where, from the rank files of `diag_dir`, into its summary.txt, and
    logged; None when the directory holds no rank's stacks."""
    if not any(Path(diag_dir).glob("rank-*.txt")):
        return None
    line = diagnostics.write_summary(Path(diag_dir))
    log(f"hang diagnosis: {line} ({Path(diag_dir) / diagnostics.SUMMARY_FILE})")
    return line
