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
    from container.distributed.runtime import distribution_parameters, init_runtime, shutdown
    from container.trainer import train
    from launcher.config.degrees import script_arguments

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    hp, dirs, pairs = parse_args(argv)
    # the seed's --hybrid_shard_degree ... arguments, which must agree with mp_parameters
    params = distribution_parameters(pairs.get("mp_parameters"), **script_arguments(hp))
    rt = init_runtime(params, sharding_strategy=hp.sharding_strategy, collective_timeout=hp.collective_timeout)
    train(rt, hp, dirs, instance_type=os.environ.get("SM_CURRENT_INSTANCE_TYPE"))
    # Not in a `finally`: a rank that failed must leave at once, never wait in a barrier that
    # its peers, still training, do not reach.
    shutdown()
    return 0


if __name__ == "__main__":
    from container.distributed.runtime import run_rank

    run_rank(main, sys.argv[1:])  # exits the process: at once, with the traceback, on a failure
