"""smlaunch's restart loop where AWS's toolkit runs the job: a SageMaker job with `max_restarts`.

AWS's PyTorch images launch torchrun once, from their own toolkit. Such a job's request therefore
names `_smlaunch/restart_loop.py` as its program, with torch_distributed off
(launcher.wire.restart_loop), so the toolkit runs that script with `python` on every host after it
has fetched the code into `/opt/ml/code`, installed its requirements.txt and written the SM_*
variables. The script lands here: it puts back the hyperparameters the SDK's request has (the
job's program, torch_distributed) and runs the bootstrap's attempt loop on that code, which starts
torchrun itself and restarts it after a fault, up to the job's max_restarts
(container.toolkit.bootstrap.run_attempts). Nothing is fetched or installed a second time.

The ranks get what they get under the toolkit's own launch (the SM_* variables of the SDK's
hyperparameters, the NCCL/EFA variables of the instance type), except that `_smlaunch/` is not
on their path: a user's script sees its code and the image's packages, as it would without
the loop (smlaunch's train.py puts `_smlaunch/` on its path itself).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import container
from container.toolkit.bootstrap import EXIT_CONTRACT_ERROR, report, run_attempts
from container.toolkit.console import log
from container.toolkit.contract import ContractError, TrainingEnv, base_dir_from_env, read_training_env
from launcher.wire import masking, restart_loop
from launcher.wire.restart_policy import RestartPolicy


def main() -> int:
    """Run the job's program under the restart loop; the exit code for the toolkit."""
    output_dir = base_dir_from_env() / "output"
    masking.install(masking.Masker.of(dict(os.environ)))  # until the hyperparameters are read
    try:
        env, policy = loop_environment(read_training_env())
    except Exception as exc:  # noqa: BLE001 - every way the job cannot start must reach output/failure
        code = EXIT_CONTRACT_ERROR if isinstance(exc, ContractError) else 1
        return report(output_dir, code, f"{type(exc).__name__}: {exc}")
    masking.install(masking.Masker.of(dict(os.environ), env.hyperparameters))
    _leave_path(env.code_dir)
    log(f"max_restarts {policy.max_restarts}: smlaunch's restart loop runs {env.user_entry_point} in place of "
        f"the toolkit's launch ({restart_loop.KEY})")
    return run_attempts(env, output_dir, policy)


def loop_environment(tree: TrainingEnv) -> tuple[TrainingEnv, RestartPolicy]:
    """The host's environment as the SDK's request would have made it, and the job's restart rules."""
    try:
        hyperparameters, policy = restart_loop.sdk_hyperparameters(tree.hyperparameters)
    except ValueError as exc:
        raise ContractError(str(exc)) from None
    return dataclasses.replace(tree, hyperparameters=hyperparameters), policy


def _leave_path(code_dir: Path) -> None:
    """Take the shipped packages' directory (`<code>/_smlaunch`, which Python put first on the path
    as the script's own) off sys.path, which the ranks' PYTHONPATH is made of. Everything the loop
    imports is imported by now."""
    shipped = Path(container.__file__).resolve().parents[1]
    if shipped == code_dir.resolve() or not shipped.is_relative_to(code_dir.resolve()):
        return  # run from an installation, not from the code: its path is the job's too
    sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != shipped]
