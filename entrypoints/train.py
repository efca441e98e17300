"""smlaunch's training script, shipped as `source_dir` (seed-compatible arguments).

This build checks the job it is given (the same validation the client ran) and prints the
parallel layout; the training runtime (model, FSDP2, context parallelism, FP8) is not in this
build yet, so the script stops with exit code 3 after the check instead of pretending to train.
"""

from __future__ import annotations

import json
import os
import sys


def parse_args(argv: list[str]) -> dict:
    """`--key value` pairs as the SageMaker toolkit passes them; unknown keys are kept."""
    args, i = {}, 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            key, _, inline = token[2:].partition("=")
            if inline:
                args[key] = inline
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                args[key] = argv[i + 1]
                i += 1
            else:
                args[key] = "true"
        i += 1
    return args


def main(argv: list[str]) -> int:
    from launcher.config import ModelParallelParameters, ParallelLayout

    args = parse_args(argv)
    raw = args.get("mp_parameters") or os.environ.get("SM_HP_MP_PARAMETERS") or "{}"
    params = ModelParallelParameters.model_validate(json.loads(raw) if raw.startswith("{") else
                                                    dict(kv.split("=", 1) for kv in raw.split(",")))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    layout = ParallelLayout.from_parameters(params, world)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"smlaunch train.py: world {world}, mesh {dict(zip(layout.mesh_dim_names, layout.mesh_shape))}")
        print("smlaunch train.py: the training runtime is not part of this build; stopping.", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
