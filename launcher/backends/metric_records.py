"""A job's metric records: the JSON Lines rank 0 writes (`metrics.jsonl`), where a local or Slurm job
directory keeps them, and one job's records as the CLI shows them (docs/metrics.md).

Records are read generically (launcher.wire.metric_lines.parse_records, the one reader and its rule
for a damaged line): whatever keys the trainer writes are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher.local.shrink import rank0_hosts
from launcher.wire.metric_lines import METRICS_FILE, parse_records

# Where rank 0 (on the first host) writes it in a job directory whose hosts never change (Kubernetes';
# a local or Slurm job's: jobdir_metrics).
JOBDIR_METRICS = Path("hosts") / "algo-1" / "output" / "data" / METRICS_FILE


def algorithm_record(cfg, image: str | None) -> dict:
    """A job record's AlgorithmSpecification (local, Slurm, Kubernetes); with the job's
    metric_definitions, which `smlaunch metrics` applies to the job's log where the script writes no
    metrics.jsonl (a user's own script)."""
    algorithm = {"TrainingImage": image or "", "TrainingInputMode": cfg.input_mode}
    if cfg.metric_definitions:
        algorithm["MetricDefinitions"] = [m.model_dump() for m in cfg.metric_definitions]
    return algorithm


@dataclass
class JobMetrics:
    """One job's records, oldest first. `x` is the key they are ordered by: `step` (metrics.jsonl)
    or `elapsed_s` (CloudWatch, which keeps no step numbers)."""

    handle: str
    source: str
    records: list[dict] = field(default_factory=list)
    x: str = "step"

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(x values, values) of the records that have `key`, in x order, each x once: a restarted job
        trains again the steps after the checkpoint it resumed from, and its latest attempt's value
        of such a step is the one that counts (the run went on from it)."""
        latest = {r[self.x]: r[key] for r in self.records if r.get(key) is not None and r.get(self.x) is not None}
        xs = sorted(latest)
        return xs, [latest[x] for x in xs]

    def restarts(self) -> list[float]:
        """The x of each restart: the step a restarted attempt resumed from, where rank 0 writes a
        record with `restart_reason` (container/resilience/attempt.py)."""
        return [r[self.x] for r in self.records if "restart_reason" in r and r.get(self.x) is not None]


def rank0_metrics(job_dir: Path, record: dict) -> list[Path]:
    """Rank 0's metrics.jsonl in a local or Slurm job's directory, on each host rank 0 ran on (its job.json
    `record` says), oldest first: the first host's, and another's after a shrink that lost it
    (launcher.local.shrink)."""
    return [job_dir / "hosts" / host / "output" / "data" / METRICS_FILE for host in rank0_hosts(record)]


def jobdir_metrics(record: dict) -> list[Path]:
    """rank0_metrics of a local or Slurm job, from its job.json record."""
    return rank0_metrics(Path(record["LocalJobDir"]), record)


def jobdir_records(record: dict) -> tuple[list[dict], list[Path]]:
    """The records of a local or Slurm job's metrics.jsonl files (jobdir_metrics), oldest first, and the
    files they came from."""
    found = [path for path in jobdir_metrics(record) if path.is_file()]
    return [r for path in found for r in parse_records(path.read_text(encoding="utf-8"), str(path))], found
