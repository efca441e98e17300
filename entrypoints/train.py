"""smlaunch's training script (the `source_dir` a job ships). Seed-compatible arguments.

    torchrun --nproc_per_node 4 train.py --model_preset llama3-tiny --dataset_type synthetic \
        --max_context_width 256 --max_steps 10 --mp_parameters hybrid_shard_degree=2

Inside a SageMaker container (or smlaunch's local mode) the directories come from SM_* variables.
"""

from __future__ import annotations

import logging
import os
import sys

# smlaunch's packages come with this script under _smlaunch/ (launcher/backends/sourcedir.py), a
# name that shadows none of the job's own packages: first on the path, here and in the processes the
# ranks start, so the runtime imports the code it was submitted with, on AWS's images where it is
# nowhere else too. Run from a checkout there is no _smlaunch/: the installed packages are imported.
_SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_smlaunch")
if os.path.isdir(_SHIPPED) and _SHIPPED not in sys.path:
    sys.path.insert(0, _SHIPPED)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (_SHIPPED, os.environ.get("PYTHONPATH"))))

# Imports inside functions: smlaunch's packages load once _smlaunch/ is first on the path (above).


def main(argv: list[str]) -> int:
    from container.args import parse_args
    from container.distributed.runtime import distribution_parameters, init_runtime, shutdown
    from container.trainer import train
    from launcher.wire.training.degrees import script_arguments

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
