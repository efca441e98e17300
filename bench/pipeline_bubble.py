"""The pipeline bubble (issue 14): the idle share of a step under GPipe and 1F1B, measured on CPU
with torch.distributed.pipelining over gloo, against the schedule's theoretical fraction
(pp - 1) / (m + pp - 1) (launcher.wire.training.layout.bubble_fraction).

Each of the `--pp` processes (one compute thread each) holds one stage of equal work: `--layers`
blocks of Linear(width, 4·width), GELU, Linear(4·width, width). A step pushes `m` microbatches of
`--rows` rows through the schedule. A stage's busy time is the wall time of its forward and
backward computations in the step (PipelineStage.forward_one_chunk and backward_one_chunk, timed
where the schedule calls them); the step time is the slowest rank's (the first stage finishes
last, with its last backward); the measured bubble is 1 - busy / step time, averaged over the
stages, so it includes the point-to-point transfers. On a shared machine run it while the load
is low: another process's time on a stage's core lands in both terms. Medians of `--steps` steps
after 2 warm-up steps.
Run: `.venv/bin/python bench/pipeline_bubble.py [--pp 2] [--microbatches 2 4 8]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from launcher.wire.opt_ml import free_port
from launcher.wire.training.layout import bubble_fraction

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_module(width: int, layers: int) -> nn.Module:
    blocks = [nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
              for _ in range(layers)]
    return nn.Sequential(*blocks)


def timed_compute(stage: PipelineStage) -> list[float]:
    """Add the wall time of every forward and backward computation of `stage` to the returned
    one-element list (the schedule calls these methods; their sends and receives are apart)."""
    busy = [0.0]
    for name in ("forward_one_chunk", "backward_one_chunk"):
        method = getattr(stage, name)

        def timed(*args, _method=method, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                busy[0] += time.perf_counter() - start

        setattr(stage, name, timed)
    return busy


def rank_main(rank: int, args, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.pp)
    torch.manual_seed(rank)
    module = stage_module(args.width, args.layers)
    for schedule_name in ("gpipe", "1f1b"):
        for m in args.microbatches:
            stage = PipelineStage(module, rank, args.pp, torch.device("cpu"))
            busy = timed_compute(stage)
            schedule = SCHEDULES[schedule_name](stage, m, loss_fn=lambda out, _: out.sum(), scale_grads=False)
            batch = torch.randn(m * args.rows, args.width)
            target = torch.zeros(m * args.rows)
            steps, busies = [], []
            for _ in range(args.steps + 2):
                dist.barrier()
                busy[0] = 0.0
                start = time.perf_counter()
                schedule.step(batch, target=target, return_outputs=False)
                # the step ends when the last stage to finish does (the first: its last backward)
                wall = torch.tensor(time.perf_counter() - start)
                dist.all_reduce(wall, op=dist.ReduceOp.MAX)
                steps.append(wall.item())
                busies.append(busy[0])
                module.zero_grad(set_to_none=True)
            step = statistics.median(steps[2:])
            idle = torch.tensor(1 - statistics.median(busies[2:]) / step) / args.pp
            dist.all_reduce(idle)  # the mean over stages
            if rank == 0:
                results.append((schedule_name, m, step, idle.item()))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    results = mp.Manager().list()
    mp.spawn(rank_main, args=(args, free_port(), results), nprocs=args.pp, join=True)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, gloo; pp {args.pp}, "
          f"stage = {args.layers} x MLP({args.width}, {4 * args.width}), microbatch {args.rows} rows")
    print("| schedule | microbatches | step | measured bubble (idle share) | theory (pp-1)/(m+pp-1) |")
    print("|---|---|---|---|---|")
    for name, m, step, idle in results:
        print(f"| {name} | {m} | {step * 1e3:.0f} ms | {idle:.3f} | {bubble_fraction(name, args.pp, m):.3f} |")


if __name__ == "__main__":
    main()
