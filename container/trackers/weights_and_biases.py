"""Weights & Biases: one run per training run (a restart continues it: container.trackers.continuity),
from rank 0, with the job's hyperparameters as its config.

wandb reads its own variables: WANDB_API_KEY (the credential), WANDB_MODE (offline: the run is
written under WANDB_DIR only, for `wandb sync` later), WANDB_BASE_URL (a W&B server of your own).
Console capture is off: the job's logs already go to CloudWatch or the job directory, masked,
and W&B would see them before the bootstrap masks them. W&B records the command line in its run's
metadata: it sees it masked as smlaunch prints it (the value of `--hf_token` and the like hidden).
W&B's SageMaker integration is off (`sagemaker_disable`): where SM_TRAINING_ENV or
/opt/ml/input/config/hyperparameters.json exists (on SageMaker, and under smlaunch's bootstrap) it
would merge the raw training environment and hyperparameters, secrets in clear, into the run's
config, and replace the run id given here with its own (`<job>-<random>-<host>`), which a restart
could not continue.

wandb makes two temporary directories as it is imported (its media's and its artifacts'), which its
finalizers remove at the interpreter's exit; a rank leaves without it (os._exit:
container.distributed.runtime), so the rank removes them as it leaves, or every run would leave them in
the machine's temporary directory.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile

from container.distributed.runtime import at_rank_exit
from container.trackers.continuity import RunIds, SentSteps
from container.trackers.run_info import RunInfo
from container.trackers.sink import FAILED, STOPPED, TrackerUnavailable, scalars
from launcher.wire.masking import installed, mask_command
from launcher.wire.training.hyperparameters import TrainingHyperparameters

NAME = "Weights & Biases"
KEY = "wandb"  # its entry in the checkpoint directory's run ids (container.trackers.continuity)
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


def remove_temporary_directories() -> None:
    """The temporary directories wandb's modules made as they were imported (see above)."""
    media = sys.modules.get("wandb.sdk.data_types._private")
    artifact = sys.modules.get("wandb.sdk.artifacts.artifact")
    for made in (getattr(media, "MEDIA_TMP", None), getattr(getattr(artifact, "Artifact", None), "_TMP_DIR", None)):
        if isinstance(made, tempfile.TemporaryDirectory):
            made.cleanup()


class WandbRun:
    def __init__(self, hp: TrainingHyperparameters, info: RunInfo, ids: RunIds):
        try:
            import wandb
            from wandb.sdk.lib.runid import generate_id
        except ImportError as exc:
            raise TrackerUnavailable(f"wandb_project is {hp.wandb_project!r} but the wandb package is not "
                                     f"installed ({exc})", INSTALL) from None
        at_rank_exit(remove_temporary_directories)
        where = {"project": hp.wandb_project, "entity": hp.wandb_entity}
        continued = ids.get(KEY, where)  # the run this training run started before a restart
        with masked_argv():
            self.run = wandb.init(project=hp.wandb_project, entity=hp.wandb_entity,
                                  name=hp.wandb_run_name or info.job_name, tags=tags(hp.wandb_tags),
                                  config={**info.hyperparameters, "smlaunch": info.facts},
                                  id=continued or generate_id(), resume="allow",
                                  settings=wandb.Settings(console="off", sagemaker_disable=True))
        ids.put(KEY, where, self.run.id)
        # a resumed run's next step follows its history (offline, W&B cannot know it: `wandb sync` merges)
        self.sent = SentSteps(NAME, self.run.step - 1 if self.run.resumed and self.run.step > 0 else None)

    def log(self, record: dict) -> None:
        if not self.sent.already_sent(record):
            self.run.log(scalars(record), step=record["step"])

    def close(self, outcome: str) -> None:
        if outcome == STOPPED:  # W&B shows the run preempted, to be resumed, not crashed
            self.run.mark_preempting()
        self.run.finish(exit_code=1 if outcome == FAILED else 0)
