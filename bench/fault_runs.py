"""What bench/recovery.py and bench/goodput.py share: a local 2-host job of smlaunch's train.py
run as a user runs it (`smlaunch submit --local` with its own SMLAUNCH_HOME), faults injected with
the test-only SMLAUNCH_FAULT_INJECTION (launcher.wire.faults), and the times its output and
records give.

Every line the job prints is stamped when it reaches this process (`Line.seen`): the bootstrap's
and the supervisor's own lines (`[smlaunch] ...`, `smlaunch | ...`) carry no time of their own.
A rank's log line carries its own (`Line.logged`, Python logging's asctime, local time): a rank's
output reaches the console through the bootstrap's tailer (0.1 s polls), so its arrival is late
and out of order. The job's TMPDIR is this run's directory, so the ranks' log files of a host the
fault killed (its bootstrap never cleans them up) are read here and removed with the run.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from launcher.wire.faults import FAULT_ENV, Fault, fault_spec

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
        """Rank log lines holding `needle`, from the job's log and from ranks' log files left in TMPDIR
        (a killed host's), by the ranks' own time."""
        found = [line for line in self.lines if needle in line.text and line.logged]
        for path in self.tmp.glob("smlaunch-ranks-*/*/attempt_*/*/*.log"):
            found += [Line(self.lines[0].seen, text) for text in path.read_text(errors="replace").splitlines()
                      if needle in text and ASCTIME.search(text)]
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
    lines = [Line(datetime.now(timezone.utc), text.rstrip("\n")) for text in proc.stdout]
    run = Run(name, tmp / "home", tmp / "tmp", lines, proc.wait())
    if run.returncode != 0:
        tail = "\n".join(line.text for line in lines[-60:])
        raise SystemExit(f"job {name} did not complete (exit code {run.returncode}):\n{tail}")
    return run


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
