"""torchtitan 0.3.0's config for the bench (its configs are Python: a config_registry function that
returns a Trainer.Config; `--module bench.gpu.titan_config --config llama3_bench` also works with
torchtitan's own `python -m torchtitan.train`).

Its documented best settings for one GPU: the Llama 3 1B/3B flavours of its model registry (the
same shapes as smlaunch's llama3.2-1b/3b presets), bf16 mixed precision (its FSDP default: bf16
parameters, fp32 reduction), fused AdamW (`default_adamw`), its chunked cross-entropy, and
`compile` of the model (per block) and the loss when the run's `compile` is 1. Data: the same
synthetic rows as the other stacks (container.data.loader.SyntheticSource), through a loader and a
tokenizer of the bench's own, so no data set or tokenizer file is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import CompileConfig, TrainingConfig
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer

from container.data.loader import SyntheticSource

FLAVOURS = {"llama3.2-1b": "1B", "llama3.2-3b": "3B", "llama3-tiny": "debugmodel"}


class SyntheticTokenizer(BaseTokenizer):
    """No text is read: the loader makes token ids. The vocabulary is the model's."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 128256

    def __init__(self, config: Config, tokenizer_path: str | None = None, **_):
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args, **kwargs) -> list[int]:
        raise NotImplementedError("the bench's rows are token ids")

    def decode(self, *args, **kwargs) -> str:
        raise NotImplementedError("the bench's rows are token ids")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class SyntheticLoader(BaseDataLoader):
    """train.py's `dataset_type synthetic` rows ({"input": ids}, next-token labels, the last ignored)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: str = "synthetic"
        seed: int = 1234
        vocab_size: int = 128256

    def __init__(self, config: Config, *, seq_len: int, local_batch_size: int, dp_rank: int = 0, **_):
        self.source = SyntheticSource(seq_len, config.vocab_size, config.seed)
        self.batch, self.next = local_batch_size, dp_rank * local_batch_size

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            rows = self.source.read(self.next, self.batch)
            self.next += self.batch
            yield {"input": rows["input_ids"]}, rows["labels"]

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state_dict: dict) -> None:
        self.next = state_dict["next"]


def bench_config(hp: dict) -> Trainer.Config:
    """The run's hyperparameters (train.py's names) as torchtitan's config."""
    model_spec = model_registry(FLAVOURS[hp["model_preset"]])
    vocab = decoder_vocab_size(model_spec)
    config = Trainer.Config(
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)),
        model_spec=model_spec,
        tokenizer=SyntheticTokenizer.Config(vocab_size=vocab),
        dataloader=SyntheticLoader.Config(seed=hp["seed"], vocab_size=vocab),
        optimizer=default_adamw(lr=hp["lr"]),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=0),
        training=TrainingConfig(local_batch_size=hp["train_batch_size"], seq_len=hp["max_context_width"],
                                steps=hp["max_steps"], max_norm=hp["grad_clip"]),
        metrics=MetricsProcessor.Config(log_freq=1),
        compile=CompileConfig(enable=bool(hp.get("compile")), components=["model", "loss"]),
    )
    if hp.get("activation_checkpointing"):
        from torchtitan.distributed.activation_checkpoint import FullAC

        config.activation_checkpoint = FullAC.Config()
    return config


def llama3_bench() -> Trainer.Config:
    """For torchtitan's own entry: the 1B at 8K, compiled."""
    return bench_config({"model_preset": "llama3.2-1b", "seed": 1234, "lr": 1e-4, "train_batch_size": 1,
                         "max_context_width": 8192, "max_steps": 20, "grad_clip": 1.0, "compile": 1})
