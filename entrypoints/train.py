"""smlaunch's training script (the `source_dir` a job ships). Seed-compatible arguments.

    torchrun --nproc_per_node 4 train.py --model_preset llama3-tiny --dataset_type synthetic \
        --max_context_width 256 --max_steps 10 --mp_parameters hybrid_shard_degree=2

Inside a SageMaker container (or smlaunch's local mode) the directories come from SM_* variables.
"""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str]) -> int:
    from container.args import parse_args
    from container.runtime import distribution_parameters, init_runtime, shutdown
    from container.trainer import train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    hp, dirs, pairs = parse_args(argv)
    params = distribution_parameters(
        pairs.get("mp_parameters"),
        hybrid_shard_degree=hp.hybrid_shard_degree,
        context_parallel_degree=hp.context_parallel_degree,
        tensor_parallel_degree=hp.tensor_parallel_degree,
    )
    rt = init_runtime(params, sharding_strategy=hp.sharding_strategy)
    try:
        train(rt, hp, dirs, instance_type=os.environ.get("SM_CURRENT_INSTANCE_TYPE"))
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Leave without interpreter finalization. DeviceMesh keeps its process groups referenced
    # after destroy_process_group, so they would be destructed during finalization, where a
    # gloo worker thread still alive now and then aborts the process (SIGABRT, "terminate
    # called without an active exception") after a run that succeeded. Everything is written;
    # flush what is buffered and go.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
