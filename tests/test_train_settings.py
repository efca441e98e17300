"""What the trainer takes from the hyperparameters (container.trainer.Settings)."""

from __future__ import annotations

from container.trainer import Settings
from launcher.config import TrainingHyperparameters


def test_bf16_comes_from_the_hyperparameter_or_smp_v1_parameters():
    hp = TrainingHyperparameters()
    assert Settings.from_hyperparameters(hp, None).bf16 is False
    assert Settings.from_hyperparameters(hp, None, smp_bf16=True).bf16 is True  # parameters: {bf16: true}
    assert Settings.from_hyperparameters(TrainingHyperparameters(bf16=1), None).bf16 is True


def test_sharded_data_parallel_clip_is_the_default_clip():
    assert Settings.from_hyperparameters(TrainingHyperparameters(), 0.5).grad_clip == 0.5
    assert Settings.from_hyperparameters(TrainingHyperparameters(grad_clip=2.0), 0.5).grad_clip == 2.0
