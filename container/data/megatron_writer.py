"""`pack --format megatron`: documents' tokens as Megatron-Core `.bin`/`.idx` pairs (format:
launcher.wire.megatron_index), which Megatron's own IndexedDataset reads and a job with
`dataset_type: indexed` reads too: one sequence a document, tokens in Megatron's choice of dtype
for the vocabulary (uint16 below 65,500 ids, else int32: its DType.optimal_dtype). The files carry
no tokenizer: a job names the one packed with (tokenizer, or vocab_size).
"""

from __future__ import annotations

import numpy as np

from container.data.indexed import ShardWriter
from launcher.wire.megatron_index import encode_prefix


class MegatronWriter(ShardWriter):
    """ShardWriter's shards and temporaries (at most `shard_tokens` tokens a pair), written as
    Megatron's pairs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dtype = "uint16" if self.vocab_size < 65_500 else "int32"

    def _finish_shard(self) -> None:
        if self._bin is None:
            return
        self._bin.close()
        offsets = np.asarray(self._offsets, dtype=np.int64)
        documents = len(offsets) - 1
        with self.paths[-1][0].open("wb") as f:
            f.write(encode_prefix(self.dtype, documents, documents))
            f.write(np.diff(offsets).astype("<i4").tobytes())  # each sequence's length
            f.write((offsets[:-1] * np.dtype(self.dtype).itemsize).astype("<i8").tobytes())  # its byte offset
            f.write(np.arange(documents + 1, dtype="<i8").tobytes())  # a document a sequence
        self._bin = None
