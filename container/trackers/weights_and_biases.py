"""Weights & Biases: one run per job, from rank 0, with the job's hyperparameters as its config.

wandb reads its own variables: WANDB_API_KEY (the credential), WANDB_MODE (offline: the run is
written under WANDB_DIR only, for `wandb sync` later), WANDB_BASE_URL (a W&B server of your own).
Console capture is off: the job's logs already go to CloudWatch or the job directory, masked,
and W&B would see them before the bootstrap masks them. W&B records the command line in its run's
metadata: it sees it masked as smlaunch prints it (the value of `--hf_token` and the like hidden).
"""

from __future__ import annotations

import contextlib
import sys

from container.trackers.run_info import RunInfo
from container.trackers.sink import TrackerUnavailable, scalars
from launcher.config import TrainingHyperparameters
from launcher.wire.masking import installed, mask_command

NAME = "Weights & Biases"
INSTALL = "install it in the image (pip install 'smlaunch[wandb]', or wandb) or remove wandb_project"


@contextlib.contextmanager
def masked_argv():
    """sys.argv masked while wandb.init reads it (its settings' `_args`), then restored."""
    argv = sys.argv
    sys.argv = [argv[0], *mask_command(argv[1:], installed())]
    try:
        yield
    finally:
        sys.argv = argv


def tags(text: str | None) -> list[str] | None:
    return [tag.strip() for tag in text.split(",") if tag.strip()] if text else None


class WandbRun:
    def __init__(self, hp: TrainingHyperparameters, info: RunInfo):
        try:
            import wandb
        except ImportError as exc:
            raise TrackerUnavailable(f"wandb_project is {hp.wandb_project!r} but the wandb package is not "
                                     f"installed ({exc})", INSTALL) from None
        with masked_argv():
            self.run = wandb.init(project=hp.wandb_project, entity=hp.wandb_entity,
                                  name=hp.wandb_run_name or info.job_name, tags=tags(hp.wandb_tags),
                                  config={**info.hyperparameters, "smlaunch": info.facts},
                                  settings=wandb.Settings(console="off"))

    def log(self, record: dict) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()
