"""TensorBoard scalars of the metric records, written by rank 0 with torch's SummaryWriter.

Where: the `tensorboard_dir` hyperparameter, else the LocalPath of the job's
TensorBoardOutputConfig, which SageMaker hands the container in
/opt/ml/input/config/tensorboardoutputconfig.json (as SageMaker Debugger reads it; smlaunch's
local mode writes the same file). SageMaker uploads that directory to the config's S3OutputPath
while the job runs; local mode does it at the end (docs/metrics.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from container.trackers.sink import scalars
from launcher.wire.opt_ml import TENSORBOARD_CONFIG, TENSORBOARD_LOCAL_PATH


def configured_local_path(config_dir: Path) -> str | None:
    """LocalPath of the job's TensorBoardOutputConfig (its default when unset), or None without one."""
    path = config_dir / TENSORBOARD_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc}): the job's TensorBoardOutputConfig cannot be read") from None
    return config.get("LocalPath") or TENSORBOARD_LOCAL_PATH


class TensorBoardScalars:
    def __init__(self, directory: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise RuntimeError(
                f"TensorBoard output to {directory} was asked for (tensorboard_dir or tensorboard_output_config), "
                f"but the tensorboard package is not installed ({exc}): install it in the image "
                "(pip install tensorboard, or smlaunch[train]) or drop those settings") from None
        self.writer = SummaryWriter(log_dir=str(directory))

    def log(self, record: dict) -> None:
        for tag, value in scalars(record).items():  # train/loss, ..., validation/loss
            self.writer.add_scalar(tag, value, global_step=record["step"])
        self.writer.flush()  # SageMaker uploads what is on disk; a stopped job keeps what it wrote

    def close(self, outcome: str | None = None) -> None:  # a TensorBoard log has no run state
        self.writer.close()
