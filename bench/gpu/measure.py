"""What a run gives back (`Outcome`) and the figures made of it, the same way for every stack:
the median step after the warm-up, tokens/s, TFLOPS and MFU from the project's FLOP count
(launcher/wire/training/flops.py: 6·N + the causal attention term) over one device peak."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from bench.gpu.table import Run

TAIL_CHARS = 3000  # of a failed run's output, in the JSON


@dataclass
class Outcome:
    status: str  # ok, failed, skipped
    reason: str | None = None
    step_s: list[float] = field(default_factory=list)  # every step's seconds, warm-up included
    losses: list[float] = field(default_factory=list)
    peak_memory_gib: float | None = None  # torch.cuda.max_memory_allocated (CPU: the process's max RSS)
    output_tail: str | None = None
    notes: dict = field(default_factory=dict)

    @classmethod
    def skipped(cls, reason: str) -> Outcome:
        return cls(status="skipped", reason=reason)

    @classmethod
    def failed(cls, reason: str, output: str | None = None) -> Outcome:
        return cls(status="failed", reason=reason, output_tail=output)


def tail(*texts) -> str:
    joined = "\n".join(t.decode(errors="replace") if isinstance(t, bytes) else t for t in texts if t)
    return joined[-TAIL_CHARS:]


def flops_per_token(model: str, seq_len: int) -> float:
    from launcher.wire.training.flops import flops_per_token as count
    from launcher.wire.training.models import PRESETS

    return count(PRESETS[model], seq_len)


def figures(run: Run, outcome: Outcome, peak_tflops: float | None) -> dict:
    """The run's record: its settings, the outcome, and (when it ran) the timed figures."""
    record = {"name": run.name, "part": run.part, "stack": run.stack, "model": run.model, "seq_len": run.seq_len,
              "tokens_per_step": run.tokens_per_step, "warmup_steps": run.warmup,
              "hyperparameters": run.hyperparameters, "baseline": run.baseline, **asdict(outcome)}
    timed = outcome.step_s[run.warmup:]
    if outcome.status != "ok" or not timed:
        if outcome.status == "ok":
            record.update(status="failed", reason=f"{len(outcome.step_s)} steps ran, none after the "
                                                  f"{run.warmup} warm-up steps")
        return record
    step = statistics.median(timed)
    tokens_per_s = run.tokens_per_step / step
    tflops = tokens_per_s * flops_per_token(run.model, run.seq_len) / 1e12
    record.update(timed_steps=len(timed), step_s_median=step, step_s_spread=(min(timed), max(timed)),
                  tokens_per_s=tokens_per_s, tflops=tflops,
                  mfu=tflops / peak_tflops if peak_tflops else None)
    return record


def compare(records: dict[str, dict]) -> None:
    """Each record with a baseline that ran gets speed-up (its tokens/s over the baseline's) and,
    when both have losses for the same steps, the largest and the last loss difference."""
    for record in records.values():
        base = records.get(record.get("baseline") or "")
        if not base or "tokens_per_s" not in record or "tokens_per_s" not in base:
            continue
        record["vs_baseline"] = {"baseline": base["name"], "speedup": record["tokens_per_s"] / base["tokens_per_s"]}
        pairs = list(zip(record["losses"], base["losses"]))
        if record["part"] == "fp8" and pairs:
            diffs = [a - b for a, b in pairs]
            record["vs_baseline"].update(loss_steps=len(pairs), loss_diff_last=diffs[-1],
                                         loss_diff_max_abs=max(map(abs, diffs)),
                                         loss_diff_mean_last_10pct=statistics.fmean(diffs[-max(1, len(diffs) // 10):]))
