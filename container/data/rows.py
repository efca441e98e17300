"""What every source makes of a row of tokens: causal-LM targets, and its documents' positions."""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


class EndOfData(Exception):
    """A non-repeating source (validation) has fewer samples than asked for."""


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Causal-LM targets: position t predicts token t+1; the last position predicts nothing."""
    shifted = torch.full_like(labels, IGNORE_INDEX)
    shifted[..., :-1] = labels[..., 1:]
    return shifted


def positions_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """RoPE positions of a row ([S] booleans, True where a document starts; the first is True):
    0 at each start, then counting up."""
    index = torch.arange(len(starts))
    return index - torch.where(starts, index, 0).cummax(0).values


def within_documents(labels: torch.Tensor, starts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Document masking's fields for a row whose documents start where `starts` is True: a
    document's last token predicts nothing (its shifted target, the next document's first token,
    becomes IGNORE_INDEX in `labels`, in place), `documents` numbers each token's document in the
    row for the attention mask."""
    labels[:-1][starts[1:]] = IGNORE_INDEX
    return {"documents": starts.cumsum(0) - 1}


def attended_length(batch: dict[str, torch.Tensor], seq_len: int) -> float:
    """The mean length a token's causal attention spans in this batch, for its useful FLOPs
    (launcher.wire.training.flops): seq_len for whole rows; with documents, Σ l² / S over each row's
    documents (a causal row's attention work is S²/2, its documents' Σ l²/2)."""
    documents = batch.get("documents")
    if documents is None:
        return float(seq_len)
    rows, seq = documents.shape
    lengths = torch.bincount((documents + torch.arange(rows)[:, None] * seq).flatten())
    return float(lengths.double().square().sum()) / (rows * seq)
