"""What bench/recovery.py and bench/goodput.py share: a local 2-host job of smlaunch's train.py
run as a user runs it (`smlaunch submit --local` with its own SMLAUNCH_HOME), faults injected with
the test-only SMLAUNCH_FAULT_INJECTION (launcher.wire.faults), and the times its output and
records give.

Every line the job prints is stamped when it reaches this process (`Line.seen`): the bootstrap's
and the supervisor's own lines (`[smlaunch] ...`, `smlaunch | ...`) carry no time of their own.
A rank's log line carries its own (`Line.logged`, Python logging's asctime, local time): a rank's
output reaches the console through the bootstrap's tailer (0.1 s polls), so its arrival is late
and out of order. A host killed with its rank (the `host` faults) takes its tailer along before it
prints the rank's last lines (the fault injection's among them), which stay only in the rank's log
file in the host's scratch (launcher.wire.opt_ml.SCRATCH_DIR) until the host's next bootstrap
removes it, seconds later: the files there are read every 50 ms while the job runs (`RankFiles`).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from launcher.wire.faults import FAULT_ENV, Fault, fault_spec
from launcher.wire.opt_ml import SCRATCH_DIR

ROOT = Path(__file__).resolve().parents[1]
ASCTIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")  # Python logging's, train.py's format
# torchrun's agent (glog style, no year): "E1127 09:11:55.515000 27252 .../api.py:1002] failed (exitcode: 1)"
AGENT = re.compile(r"^[EWI](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) \d+ \S+\] failed \(exitcode")


def hyperparameters(max_steps: int, checkpoint_freq: int, step_timeout: int) -> dict:
    return {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64,
            "train_batch_size": 2, "seed": 7, "logging_freq": 1, "max_steps": max_steps,
            "checkpoint_freq": checkpoint_freq, "step_timeout": step_timeout}


@dataclass(frozen=True)
class Line:
    seen: datetime  # when it reached this process
    text: str  # as printed: `algo-1 | ...`, `smlaunch | ...` or the CLI's own

    @property
    def logged(self) -> datetime | None:
        """The rank's own time of a logging line (None for other lines)."""
        found = ASCTIME.search(self.text)
        return _local(datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")) if found else None


@dataclass(frozen=True)
class Run:
    name: str
    home: Path
    tmp: Path  # the job's TMPDIR
    lines: list[Line]
    returncode: int
    rank_files: dict[Path, str] = field(default_factory=dict)  # the ranks' log files as last read (RankFiles)

    @property
    def job_dir(self) -> Path:
        return self.home / "jobs" / self.name

    def status(self) -> dict:
        """`smlaunch status NAME --json`: the record with its Restarts and Goodput."""
        proc = subprocess.run([sys.executable, "-m", "launcher.cli", "status", self.name, "--json"],
                              env=_env(self.home, self.tmp), cwd=ROOT, capture_output=True, text=True, check=False)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"smlaunch status {self.name} failed:\n{proc.stderr[-2000:]}")
        return json.loads(proc.stdout)

    def rank_lines(self, needle: str) -> list[Line]:
        """Rank log lines holding `needle`, from the job's log and from the ranks' log files (a killed
        host's last lines are there only), by the ranks' own time."""
        found = [line for line in self.lines if needle in line.text and line.logged]
        for text in self.rank_files.values():
            found += [Line(self.lines[0].seen, line) for line in text.splitlines()
                      if needle in line and ASCTIME.search(line)]
        return sorted(found, key=lambda line: line.logged)

    def agent_failures(self) -> list[datetime]:
        """When torchrun's agents saw a rank fail ("failed (exitcode: N)"), by their own clocks."""
        year = self.lines[0].seen.year
        out = []
        for line in self.lines:
            found = AGENT.search(line.text.split(" | ", 1)[-1])
            if found:
                month, day, clock = found.groups()
                out.append(_local(datetime.strptime(f"{year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")))
        return sorted(out)

    def printed(self, needle: str) -> list[Line]:
        """The lines holding `needle`, by arrival."""
        return [line for line in self.lines if needle in line.text]


def submit(tmp: Path, name: str, hp: dict, faults: list[Fault], max_restarts: int, **fields) -> Run:
    """Run the job to its end (2 simulated hosts x 1 process; `fields`: more of the job file's) and return
    what it printed."""
    tmp.mkdir(parents=True)
    (tmp / "tmp").mkdir()
    environment = {FAULT_ENV: fault_spec(*faults)} if faults else {}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 2, "processes_per_host": 1, "distribution": {"torch_distributed": {"enabled": True}},
           "max_restarts": max_restarts, "hyperparameters": hp, "environment": environment, **fields}
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", str(tmp / "job.yaml"), "--local",
                             "--job-name", name], env=_env(tmp / "home", tmp / "tmp"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with RankFiles(tmp / "home" / "jobs" / name) as rank_files:
        lines = [Line(datetime.now(timezone.utc), text.rstrip("\n")) for text in proc.stdout]
    run = Run(name, tmp / "home", tmp / "tmp", lines, proc.wait(), rank_files.read)
    if run.returncode != 0:
        tail = "\n".join(line.text for line in lines[-60:])
        raise SystemExit(f"job {name} did not complete (exit code {run.returncode}):\n{tail}")
    return run


class RankFiles:
    """The ranks' log files in the job's hosts' scratch, read every 50 ms while the job runs: each file's
    longest text seen (they only grow, until their host's next bootstrap or the job's end removes them)."""

    def __init__(self, job_dir: Path):
        self.job_dir, self.read, self._done = job_dir, {}, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> RankFiles:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(0.05):
            for path in self._listed():
                try:
                    text = path.read_text(errors="replace")
                except OSError:  # removed between the listing and the read
                    continue
                if len(text) > len(self.read.get(path, "")):
                    self.read[path] = text

    def _listed(self) -> list[Path]:
        try:
            return list(self.job_dir.glob(f"hosts/*/{SCRATCH_DIR}/attempt-*/ranks/**/*.log"))
        except OSError:  # a directory removed while it was listed: the next poll lists again
            return []


def _env(home: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "SMLAUNCH_"))}
    # unbuffered: every line leaves the CLI when it is printed, so its arrival time is its time
    env.update(SMLAUNCH_HOME=str(home), TMPDIR=str(tmp), OMP_NUM_THREADS="1", NO_COLOR="1", PYTHONUNBUFFERED="1")
    return env


def iso(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _local(naive: datetime) -> datetime:
    """A time the job's processes logged on this machine's clock, as an aware datetime."""
    return naive.astimezone(timezone.utc)


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"load average {load:.1f} at the start")
