"""The ranks' output under torchrun: passed through to the console unprefixed, kept per rank.

torchrun runs with `--redirects 3 --log-dir <dir>`, so every rank writes its stdout and stderr to
`<dir>/<run id>/attempt_<n>/<local rank>/{stdout,stderr}.log`. `RankLogs` copies those files to
this process's stdout and stderr as they grow, as they are: torchrun's own `--tee` would echo them
with a `[default0]:` prefix on every line, which breaks `^`-anchored SageMaker MetricDefinitions
regexes, and the sagemaker-training toolkit passes rank output through unprefixed.
`rank_stderr()` reads a rank's stderr back for the failure file.

What a script prints may hold a secret (a token it echoes): every line goes through the masker
the bootstrap installed (launcher.wire.masking) before it reaches the console.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
from pathlib import Path
from typing import BinaryIO

from launcher.wire.masking import Masker, StreamMasker, installed

POLL_S = 0.1  # as often as torchrun's own tailer looks at the files
TAIL_BYTES = 64 * 1024  # of a rank's stderr, for its traceback; also the longest line held back


def _files(log_dir: Path, local_rank: int | str = "*", stream: str = "*") -> list[str]:
    return glob.glob(str(Path(log_dir) / "*" / "attempt_*" / str(local_rank) / f"{stream}.log"))


def stderr_file(log_dir: Path, local_rank: int) -> Path | None:
    """`local_rank`'s stderr file of its latest attempt; None before it has one."""
    files = _files(log_dir, local_rank, "stderr")
    return Path(max(files, key=os.path.getmtime)) if files else None


def rank_stderr(log_dir: Path, local_rank: int) -> str:
    """The last TAIL_BYTES of what `local_rank` wrote to stderr (its latest attempt); "" if none."""
    path = stderr_file(log_dir, local_rank)
    if path is None:
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
        return f.read().decode("utf-8", "replace")


class _Tail:
    """One rank's file: what was written since the last look, in whole lines."""

    def __init__(self, path: str, dst: BinaryIO, masker: Masker):
        self.file = open(path, "rb")  # noqa: SIM115 - open while the rank runs, closed by RankLogs
        self.dst = dst
        self.pending = b""
        self.masked = StreamMasker(masker)  # whole lines need no hold-back; a cut long line does

    def copy(self, final: bool) -> None:
        data = self.pending + self.file.read()
        # Whole lines only (a \r ends one too: progress bars), so that ranks printing at the same
        # time do not cut into each other's lines; everything once the rank has ended.
        end = len(data) if final or len(data) >= TAIL_BYTES else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        out = self.masked.feed(data[:end], final=final)
        if out:
            self.dst.write(out)
            self.dst.flush()
        self.pending = data[end:]


class RankLogs:
    """Streams the ranks' log files under `log_dir` to stdout/stderr, masked by `masker`
    (default: the one the bootstrap installed), until stop()."""

    def __init__(self, log_dir: Path, masker: Masker | None = None):
        self._log_dir = log_dir
        self._masker = masker or installed()
        self._tails: dict[str, _Tail] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-logs", daemon=True)

    def start(self) -> RankLogs:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Once torchrun has ended (so have the ranks): copy what is left and close the files."""
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            final = self._stopping.is_set()  # read before the pass: the last pass sees every byte
            for path in sorted(_files(self._log_dir)):  # new ranks (or attempts) appear as they start
                if path not in self._tails:
                    dst = sys.stdout.buffer if path.endswith("stdout.log") else sys.stderr.buffer
                    self._tails[path] = _Tail(path, dst, self._masker)
            for tail in self._tails.values():
                tail.copy(final)
            if final:
                break
            self._stopping.wait(POLL_S)
        for tail in self._tails.values():
            tail.file.close()
