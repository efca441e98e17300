"""What both indexed formats share (smlaunch's shards: launcher.wire.token_shards; Megatron-Core's
corpora: launcher.wire.megatron_index): the two files' suffixes and the error naming a file."""

from __future__ import annotations

from pathlib import Path

IDX_SUFFIX, BIN_SUFFIX = ".idx", ".bin"


class ShardError(ValueError):
    """A shard that cannot be trusted: the file, what is wrong, and the fix."""

    def __init__(self, path: Path, problem: str, fix: str):
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"{path}: {problem}; {fix}")
