"""Corpora written by megatron-core's own IndexedDatasetBuilder (the test extra: megatron-core 0.16.1),
for the tests that check smlaunch reads and trains them as Megatron-Core does."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch


def indexed_dataset():
    """megatron.core.datasets.indexed_dataset, or the calling test module skipped without it."""
    with warnings.catch_warnings():  # megatron.core warns that Transformer Engine and Apex are absent
        warnings.simplefilter("ignore")
        return pytest.importorskip("megatron.core.datasets.indexed_dataset",
                                   reason="megatron-core (the test extra) is not installed")


def build(prefix: Path, docs, dtype=np.uint16, how: str = "items") -> Path:
    """A corpus of `docs` (each a list of sequences) written by Megatron's IndexedDatasetBuilder at
    `prefix`: sequence by sequence (add_item and end_document), or a document at a time
    (add_document); returns the directory holding it."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = indexed_dataset().IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        if how == "items":
            for sequence in doc:
                builder.add_item(torch.tensor(sequence, dtype=torch.int64))
            builder.end_document()
        else:
            builder.add_document(torch.tensor([t for s in doc for t in s], dtype=torch.int64), [len(s) for s in doc])
    builder.finalize(f"{prefix}.idx")
    return prefix.parent


def smlaunch_documents(stream) -> list[list[int]]:
    """Each document's tokens of a container.data.indexed.TokenStream, as smlaunch reads them
    (inspect's reader: container.data.inspect_corpus.shard_documents)."""
    from container.data.inspect_corpus import shard_documents

    return [ids for _, ids in shard_documents(stream, 0, None)]
