"""Rank 0's training records: what a logged step's record holds (`Throughput.record`: loss, gradient
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
from launcher.wire.metric_lines import METRICS_FILE, drop_cut_line, format_metric_line
from launcher.wire.training import flops
from launcher.wire.training.models import ModelSpec
from launcher.wire.training.run_settings import RunSettings

log = logging.getLogger("smlaunch")


class MetricsWriter:
    """Rank 0's records: the [metrics] line, metrics.jsonl, then TensorBoard and the trackers
    (container/trackers), each fed the same record here and nowhere else."""

    def __init__(self, rt: Runtime, directory: Path, tensorboard_dir: Path | None = None, trackers: list = ()):
        self.enabled = rt.is_main
        self.path = directory / METRICS_FILE
        self.sinks = [TensorBoardScalars(tensorboard_dir)] if self.enabled and tensorboard_dir else []
        self.sinks += trackers if self.enabled else []
        if self.enabled:
            directory.mkdir(parents=True, exist_ok=True)
            if cut := drop_cut_line(self.path):  # appended to, it would be a damaged line (parse_records)
                log.warning("metrics: removed the last %d bytes of %s, a record the previous attempt's end cut "
                            "before its newline", cut, self.path)

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


class Throughput:
    """Tokens, seconds and useful FLOPs of the timed steps (a run's first two steps, from its start or
    its resume, are warm-up: the allocator, the first all-gathers), and a logged step's record of them."""

    def __init__(self, rt: Runtime, s: RunSettings, spec: ModelSpec, instance_type: str | None, start_step: int):
        self.rt, self.s, self.start_step = rt, s, start_step
        self.tokens_per_step = s.micro_batch * s.seq_len * s.grad_accum * rt.dp_size
        self.seed_flops_token = flops.seed_flops_per_token(spec, s.seq_len)
        self.peak = flops.peak_tflops(instance_type, "fp8" if s.fp8.enabled else "bf16",
                                      torch.cuda.get_device_name() if rt.device.type == "cuda" else None)
        self.tokens, self.seconds = 0, 0.0
        self.flops = 0.0  # useful FLOPs of the timed steps: attention over what the documents span

    def step(self, step: int, elapsed: float, flops_token: float) -> None:
        if step > self.start_step + 2:  # leave out warm-up (allocator, first all-gathers)
            self.tokens += self.tokens_per_step
            self.seconds += elapsed
            self.flops += self.tokens_per_step * flops_token

    def record(self, step: int, loss: float, grad_norm: float, lr: float, elapsed: float,
               step_flops_token: float) -> dict:
        """A logged step's record: its loss, gradient norm and learning rate, the throughput of the timed
        steps so far (of this step alone while there are none), TFLOPS and MFU, peak memory."""
        flops_token = self.flops / self.tokens if self.tokens else step_flops_token
        tokens_per_s = self.tokens / self.seconds if self.seconds else self.tokens_per_step / elapsed
        per_device = tokens_per_s / self.rt.world_size
        tflops = per_device * flops_token / 1e12
        # The losses and the norm stay unrounded in metrics.jsonl: runs are compared on them (layouts
        # against one process), and 6 decimals would cost more than fp32's own error. The printed
        # [metrics] line rounds for reading (format_metric_line).
        record = {
            "step": step,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "samples_per_s": round(tokens_per_s / self.s.seq_len, 4),
            "tokens_per_s": round(tokens_per_s, 1),
            "tokens_per_s_per_gpu": round(per_device, 2),
            "tflops_per_gpu": round(tflops, 4),
            "tflops_per_gpu_seed_formula": round(per_device * self.seed_flops_token / 1e12, 4),
            "peak_memory_gib": round(_peak_memory_gib(self.rt), 3),
        }
        if self.peak:
            record["mfu"] = round(flops.mfu(tflops, self.peak), 4)
        return record


def _peak_memory_gib(rt: Runtime) -> float:
    if rt.device.type == "cuda":
        return torch.cuda.max_memory_allocated(rt.device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
