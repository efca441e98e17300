"""One torchtitan run in its own process (bench/gpu/titan.py starts it): one rank, its Trainer built
from bench/gpu/titan_config.py, each `train_step` timed as train.py times its own (synchronize, the
host clock, the step, synchronize; torchtitan's step includes its batch and its loss's logging).
Run: python -m bench.gpu.titan_run '<run as JSON>'; the last line is `RESULT <json>`."""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def single_rank_environment() -> None:
    """torchtitan initialises torch.distributed from torchrun's variables: one rank of one."""
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531"}.items():
        os.environ.setdefault(key, value)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def train(hp: dict) -> dict:
    single_rank_environment()
    from torchtitan.tools.logging import init_logger

    from bench.gpu.titan_config import bench_config

    init_logger()
    config = bench_config(hp)
    config.dump_folder = os.environ.get("DUMP_FOLDER", config.dump_folder)
    trainer = config.build()
    step_s, losses = [], []
    inner = trainer.train_step

    def timed_step(*args, **kwargs):
        sync()
        began = time.perf_counter()
        result = inner(*args, **kwargs)
        sync()
        step_s.append(time.perf_counter() - began)
        return result

    trainer.train_step = timed_step
    try:
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {"step_s": step_s, "losses": losses, "peak_memory_gib": peak}


if __name__ == "__main__":
    print("RESULT " + json.dumps(train(json.loads(sys.argv[1]))), flush=True)
