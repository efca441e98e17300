"""Rank 0's training records: what a logged step's record holds (`step_record`: loss, gradient
norm, learning rate, throughput, TFLOPS and MFU, peak memory) and where it goes (`MetricsWriter`:
the [metrics] line, metrics.jsonl, TensorBoard and the trackers)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from container.distributed.runtime import Runtime
from container.tensorboard import TensorBoardScalars
from container.trackers.sink import FAILED, FINISHED
from launcher.wire.metric_lines import format_metric_line
from launcher.wire.training import flops

log = logging.getLogger("smlaunch")


class MetricsWriter:
    """Rank 0's records: the [metrics] line, metrics.jsonl, then TensorBoard and the trackers
    (container/trackers), each fed the same record here and nowhere else."""

    def __init__(self, rt: Runtime, directory: Path, tensorboard_dir: Path | None = None, trackers: list = ()):
        self.enabled = rt.is_main
        self.path = directory / "metrics.jsonl"
        self.sinks = [TensorBoardScalars(tensorboard_dir)] if self.enabled and tensorboard_dir else []
        self.sinks += trackers if self.enabled else []
        if self.enabled:
            directory.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        print(format_metric_line(record["step"], **{k: v for k, v in record.items() if k != "step"}), flush=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink.log(record)

    def close(self, outcome: str = FINISHED) -> None:
        """Finish the trackers' runs with how training ended (the ranks leave with os._exit:
        nothing would at exit). Once: a failure after a close finds nothing left to mark."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(outcome)

    def fail(self) -> None:
        """Mark the runs failed, on the way out of a failing rank: a tracker's own error here is a
        warning, never the error the job reports."""
        try:
            self.close(FAILED)
        except Exception as exc:  # noqa: BLE001 - the job's own error is already on its way up
            log.warning("metrics: marking the trackers' runs failed did not work (%s: %s)", type(exc).__name__, exc)


def step_record(rt, step, loss, grad_norm, lr, timed_tokens, timed_seconds, tokens_per_step, elapsed, s,
            flops_token, seed_flops_token, peak) -> dict:
    tokens_per_s = timed_tokens / timed_seconds if timed_seconds else tokens_per_step / elapsed
    per_device = tokens_per_s / rt.world_size
    tflops = per_device * flops_token / 1e12
    # The losses and the norm stay unrounded in metrics.jsonl: runs are compared on them (layouts
    # against one process), and 6 decimals would cost more than fp32's own error. The printed
    # [metrics] line rounds for reading (format_metric_line).
    record = {
        "step": step,
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": lr,
        "samples_per_s": round(tokens_per_s / s.seq_len, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "tokens_per_s_per_gpu": round(per_device, 2),
        "tflops_per_gpu": round(tflops, 4),
        "tflops_per_gpu_seed_formula": round(per_device * seed_flops_token / 1e12, 4),
        "peak_memory_gib": round(_peak_memory_gib(rt), 3),
    }
    if peak:
        record["mfu"] = round(flops.mfu(tflops, peak), 4)
    return record


def _peak_memory_gib(rt: Runtime) -> float:
    if rt.device.type == "cuda":
        return torch.cuda.max_memory_allocated(rt.device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
