"""`smlaunch logs JOB --diagnostics`: what a hang left in the job's output (docs/faults.md, "Hangs").

Local and Slurm jobs keep each host's output data directory on disk, a Kubernetes job's pods on its
claim (read through client_path) or in S3 (downloaded): the diagnosis is made here over every host's
rank files (launcher.wire.diagnostics), so it sees the ranks of all hosts, which no host's own
summary.txt does. Where this machine cannot read them (a SageMaker job's output.tar.gz, which is not
downloaded; a claim not mounted here), the backend says where they are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from launcher.backends.base import FilesElsewhere
from launcher.wire import diagnostics
from launcher.wire.terminal import printable

FR_TRACE = "python -m torch.distributed.flight_recorder.fr_trace"


def lines(job: str, hosts: dict[str, Path]) -> list[str]:
    """The diagnosis of each attempt over all hosts, then each host's summary and rank files."""
    attempts: dict[str, dict[str, Path]] = {}
    for host, output_data in hosts.items():
        for directory in diagnostics.attempt_dirs(output_data):
            attempts.setdefault(directory.name, {})[host] = directory
    if not attempts:
        return [f"job {job} has no diagnostics: no rank's step watchdog fired and no stacks were collected "
                f"(they would be in diagnostics/ of each host's output data directory)"]
    out = []
    for attempt in sorted(attempts, key=lambda a: int(a.split("-", 1)[1])):
        directories = attempts[attempt]
        out.append(f"== {job}, {attempt.replace('-', ' ')} ==")
        out.append("diagnosis: " + diagnostics.diagnose(diagnostics.read_ranks(list(directories.values()))))
        for host, directory in directories.items():
            out += _files(host, directory)
    return out


def _files(host: str, directory: Path) -> list[str]:
    out = []
    summary = directory / diagnostics.SUMMARY_FILE
    ranks = sorted(directory.glob("rank-*.txt"), key=lambda p: int(p.stem.split("-", 1)[1]))
    for path in ([summary] if summary.is_file() else []) + ranks:
        out.append(f"-- {host}: {path} --")
        out += [printable(line) for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    traces = directory / diagnostics.FLIGHT_RECORDER_DIR
    dumps = sorted(traces.glob(diagnostics.FLIGHT_RECORDER_PREFIX + "*")) if traces.is_dir() else []
    if dumps:
        out.append(f"-- {host}: {len(dumps)} Flight Recorder dump(s) in {traces}: read them with "
                   f"`{FR_TRACE} {traces}` (with the other hosts' dumps in one directory) --")
    return out


def show(job: str, backend, echo: Callable[[str], None]) -> None:
    """The diagnosis over every host's output data where this machine reads it (the backend says where:
    Backend.output_data_dirs), else where the files are."""
    try:
        hosts = backend.output_data_dirs(job)
    except FilesElsewhere as elsewhere:
        echo(str(elsewhere))
        return
    for line in lines(job, hosts):
        echo(line)
