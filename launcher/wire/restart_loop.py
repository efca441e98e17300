"""How a SageMaker job with `max_restarts` (or `restart_on_exit_codes`) runs smlaunch's restart loop under AWS's toolkit
(docs/container.md, "max_restarts on AWS's images").

AWS's PyTorch images start torchrun themselves (the toolkit's TorchDistributedRunner, once), so the
budget alone would do nothing there. Such a job's request changes three hyperparameters, and
nothing else: `sagemaker_program` names SCRIPT in the code's `_smlaunch/` directory,
`sagemaker_torch_distributed_enabled` is left out (so the toolkit starts one `python SCRIPT` per
host, after fetching the code and installing its requirements.txt as for any job), and KEY holds
the restart rules (launcher.wire.restart_policy) and the values the first two replaced. The script
(container/toolkit/restart_loop.py) puts those values back and runs the bootstrap's attempt loop on
the code the toolkit fetched: the job's own program under torchrun, restarted after a fault. The
ranks see the hyperparameters and SM_* variables of the SDK's request, as if no restart loop stood
between.

A hyperparameter, not an environment variable: smlaunch's own image runs `python -m container
train`, which reads SMLAUNCH_MAX_RESTARTS and would restart the loop itself as well.
"""

from __future__ import annotations

from typing import Any

from launcher.wire.restart_policy import PolicyError, RestartPolicy

SCRIPT = "restart_loop.py"  # in the code's packages directory (`_smlaunch/`, launcher.backends.sourcedir)
KEY = "sagemaker_smlaunch_restart_loop"  # `sagemaker_`: the toolkit passes it to no script as an argument
REPLACED = ("sagemaker_program", "sagemaker_torch_distributed_enabled")
# What the shipped SCRIPT holds. Run as `python _smlaunch/restart_loop.py`, Python puts `_smlaunch/`
# first on the path, so the `container` package imported is the one shipped with the job.
STUB = (b'"""smlaunch\'s restart loop for max_restarts (container/toolkit/restart_loop.py)."""\n'
        b"import sys\n\nfrom container.toolkit.restart_loop import main\n\nsys.exit(main())\n")


def loop_hyperparameters(hyperparameters: dict[str, Any], policy: RestartPolicy, program: str) -> dict[str, Any]:
    """The job's hyperparameters (before encoding) with the toolkit pointed at `program`, the
    shipped SCRIPT; the restart rules and the replaced values in KEY."""
    out = dict(hyperparameters)
    replaced = {key: out.pop(key) for key in REPLACED if key in out}
    out["sagemaker_program"] = program
    out[KEY] = {**policy.to_dict(), "replaced": replaced}
    return out


def sdk_hyperparameters(decoded: dict[str, Any]) -> tuple[dict[str, Any], RestartPolicy]:
    """(the hyperparameters as the SDK's request has them, the job's restart rules) of decoded
    hyperparameters; those of a job without the loop come back as they are, with no rules."""
    if KEY not in decoded:
        return dict(decoded), RestartPolicy()
    loop = decoded[KEY]
    try:
        if not isinstance(loop, dict) or not isinstance(loop.get("replaced"), dict):
            raise PolicyError("no replaced values")
        policy = RestartPolicy.from_dict(loop)
    except PolicyError:
        raise ValueError(f"hyperparameter {KEY}={loop!r} is not what smlaunch writes "
                         '({"max_restarts": <int >= 0>, "replaced": {...}}): submit the job again with '
                         "smlaunch") from None
    out = {k: v for k, v in decoded.items() if k != KEY and k not in REPLACED}
    out.update({k: v for k, v in loop["replaced"].items() if k in REPLACED})
    return out, policy
