"""What a hang leaves behind, and which rank it names (docs/faults.md, "Hangs").

The layout, in a host's output data directory (so SageMaker's output.tar.gz carries it):

    diagnostics/attempt-<N>/rank-<R>.txt       that rank's Python stacks: one section per dump
    diagnostics/attempt-<N>/summary.txt        which rank hung and where (`write_summary`)
    diagnostics/attempt-<N>/flight_recorder/   torch's Flight Recorder dumps (nccl_trace_rank_<R>)

A section is a header line (`stacks_header`), `key: value` lines (why it was dumped, the main
thread's id), then faulthandler's text of every thread. Ranks write theirs (the step watchdog of
container/resilience/step_watch.py), the bootstrap writes those it asks for with SIGUSR1
(container/toolkit/diagnostics.py), and `smlaunch logs --diagnostics` reads them from every
host, which is why the diagnosis lives here: the launcher may import no container code.

The diagnosis: a rank whose main thread waits in torch.distributed (a collective, or its wait)
is a victim; one that does not, while others do, is where the job stopped. It reads the first
section of each rank's file, the one nearest to the hang. On GPUs a rank waiting on NCCL often
waits at its next synchronisation (`.item()`, `cuda.synchronize`) instead; there the Flight
Recorder's dumps are the evidence (which rank never joined collective number N).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from launcher.wire import masking
from launcher.wire.faults import DIAGNOSTICS_DIR

SUMMARY_FILE = "summary.txt"
FLIGHT_RECORDER_DIR = "flight_recorder"
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"  # torch's own default name, so fr_trace reads them as they are
# the variables naming the dump files' prefix: torch 2.9's and later, and the earlier name
FLIGHT_RECORDER_FILES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_SECTION = "=== smlaunch stacks:"
_HEADER = re.compile(r"^=== smlaunch stacks: rank (\d+)(?: of (\d+))?, host (\S+), pid (\d+) ===$")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_WAITING = ("torch/distributed/",)  # a collective, its wait, FSDP's waits
_SYNC = ("torch/cuda/",)  # `cuda.synchronize`: where a rank waits on NCCL's work
_OURS = ("container", "launcher", "entrypoints", "_smlaunch")  # installed or shipped, still smlaunch's code


def attempt_dir(output_data: Path, attempt: int) -> Path:
    return Path(output_data) / DIAGNOSTICS_DIR / f"attempt-{attempt}"


def rank_file(directory: Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.txt"


def stacks_header(rank: int, world: int | None, host: str, pid: int, **fields: str) -> str:
    """A section's first lines; `fields` become `key: value` lines (underscores read as spaces)."""
    of = f" of {world}" if world else ""
    lines = [f"{_SECTION} rank {rank}{of}, host {host}, pid {pid} ==="]
    lines += [f"{key.replace('_', ' ')}: {value}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def nccl_fields(environ, version: str | None = None) -> dict[str, str]:
    """A hang's NCCL lines for a rank's header: NCCL's version where the writer knows it, and the
    rank's NCCL_* settings, each secret-looking value masked (a plugin's key, a proxy's password)."""
    settings = masking.mask_secrets({k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")})
    fields = {"nccl": version} if version else {}
    fields["nccl_settings"] = ", ".join(f"{k}={v}" for k, v in settings.items()) or "none set (NCCL's defaults)"
    return fields


# the header fields summary.txt repeats under each rank (stacks_header writes "_" as a space)
SUMMARY_FIELDS = ("nccl", "nccl settings", "flight recorder")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.function} ({self.path}:{self.line})"

    @property
    def waiting(self) -> bool:
        return any(mark in self.path for mark in _WAITING) or (
            any(mark in self.path for mark in _SYNC) and self.function == "synchronize")

    @property
    def ours(self) -> bool:
        """Code of the job or of smlaunch's runtime: not Python's own, not a third-party package."""
        if self.path.startswith("<"):
            return False
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in self.path:
                return self.path.split(marker, 1)[1].split("/", 1)[0] in _OURS
        return not re.search(r"/lib/python3\.\d+/", self.path)


@dataclass(frozen=True)
class RankStacks:
    rank: int
    world: int | None
    host: str
    fields: dict[str, str]
    main: list[Frame]  # the main thread's frames, innermost first; [] when it was not found

    @property
    def waiting(self) -> bool:
        return bool(self.main) and self.main[0].waiting

    @property
    def where(self) -> str:
        """The innermost frame, and the innermost of the job's or smlaunch's code where that differs."""
        if not self.main:
            return "no stacks"
        own = next((f for f in self.main if f.ours), None)
        return str(self.main[0]) if own in (None, self.main[0]) else f"{own}, inside {self.main[0]}"


def parse_section(text: str) -> RankStacks | None:
    """One section's rank, header fields and main thread; None if it has no header."""
    lines = text.splitlines()
    match = _HEADER.match(lines[0]) if lines else None
    if not match:
        return None
    fields, threads, current = {}, {}, None
    for line in lines[1:]:
        if line.startswith("--- "):  # py-spy's view and the log's tail follow the stacks
            break
        thread, frame = _THREAD.match(line), _FRAME.match(line)
        if thread:
            current = threads.setdefault((thread.group(2), thread.group(1) == "Current thread"), [])
        elif frame and current is not None:
            current.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
        elif current is None and ": " in line:
            key, value = line.split(": ", 1)
            fields[key] = value
    rank, world, host, _pid = match.groups()
    return RankStacks(int(rank), int(world) if world else None, host, fields, _main_thread(threads, fields))


def _main_thread(threads: dict[tuple[str, bool], list[Frame]], fields: dict[str, str]) -> list[Frame]:
    """By the id the header names (the watchdog's dumps), else the thread started by no
    `threading` bootstrap (a SIGUSR1 dump), else the thread the signal ran in."""
    named = fields.get("main thread")
    for (ident, _), frames in threads.items():
        if named and int(ident, 16) == int(named, 16):
            return frames
    unthreaded = [frames for frames in threads.values() if frames and frames[-1].function == "<module>"]
    if len(unthreaded) == 1:
        return unthreaded[0]
    return next((frames for (_, current), frames in threads.items() if current), [])


def read_rank_file(path: Path) -> RankStacks | None:
    """The first section of a rank's file (the dump nearest to the hang)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    sections = text.split("\n" + _SECTION)
    return parse_section(sections[0]) if sections[0].startswith(_SECTION) else None


def read_ranks(directories: list[Path]) -> list[RankStacks]:
    """Every rank's stacks in these attempt directories (one per host), by rank."""
    found = {}
    for directory in directories:
        for path in sorted(Path(directory).glob("rank-*.txt")):
            stacks = read_rank_file(path)
            if stacks is not None:
                found.setdefault(stacks.rank, stacks)
    return [found[rank] for rank in sorted(found)]


def diagnose(ranks: list[RankStacks]) -> str:
    """One line: which rank(s) hung and where, from their main threads."""
    world = max((r.world for r in ranks if r.world), default=None)
    unasked = [r.rank for r in ranks if not r.main]  # a rank that could not be asked (stopped, no handler)
    ranks = [r for r in ranks if r.main]
    if not ranks:
        asked = f" (rank(s) {_names(unasked)} could not be asked)" if unasked else ""
        return "no rank's stacks were recorded" + asked
    waiting = [r for r in ranks if r.waiting]
    others = [r for r in ranks if not r.waiting]
    missing = sorted((set(range(world)) - {r.rank for r in ranks}) | set(unasked) if world else unasked)
    absent = f"; no stacks from rank(s) {_names(missing)}" if missing else ""
    if waiting and others:
        where = "; ".join(f"rank {r.rank} (host {r.host}) in {r.where}" for r in others)
        return (f"rank(s) {_names([r.rank for r in others])} did not reach the collective that rank(s) "
                f"{_names([r.rank for r in waiting])} waited in: {where}{absent}")
    if waiting:
        return (f"every rank with stacks ({_names([r.rank for r in waiting])}) waited in a collective: the rank "
                f"that did not join it left no stacks here{absent or ' (another host, or it had ended)'}")
    where = "; ".join(f"rank {r.rank} (host {r.host}) in {r.where}" for r in others)
    return f"no rank waited in a collective: {where}{absent}"


def _names(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def write_summary(directory: Path) -> str:
    """Diagnose the ranks of one attempt directory, write summary.txt there, return its line."""
    ranks = read_ranks([directory])
    line = diagnose(ranks)
    detail = "".join(f"rank {r.rank} (host {r.host}): {r.fields.get('reason', 'stacks on request')}\n"
                     f"  main thread in {r.where}\n"
                     + "".join(f"  {key}: {r.fields[key]}\n" for key in SUMMARY_FIELDS if key in r.fields)
                     for r in ranks)
    (Path(directory) / SUMMARY_FILE).write_text(f"{line}\n\n{detail}", encoding="utf-8")
    return line


def attempt_dirs(output_data: Path) -> list[Path]:
    """The attempt directories of one host that hold a file, oldest attempt first."""
    root = Path(output_data) / DIAGNOSTICS_DIR
    found = [d for d in root.glob("attempt-*") if d.is_dir() and any(p.is_file() for p in d.rglob("*"))]
    return sorted(found, key=lambda d: int(d.name.split("-", 1)[1]) if d.name.split("-", 1)[1].isdigit() else -1)
