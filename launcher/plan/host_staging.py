"""Host memory of asynchronous checkpoints (`checkpoint_async_mode`, docs/checkpoints.md).

An asynchronous save first copies each rank's shards of the model and optimizer state into host
memory (container/checkpoint/background.py), then writes that copy while training goes on. The
copy is exactly the state the memory model counts per accelerator: the fp32 parameter shards and
the optimizer state (launcher/plan/terms.py, `parameters` and `optimizer`). Every rank of a host
stages its own, at the same time; `async_with_pinned_mem` keeps its pinned copy for the whole run,
`async` allocates it at each save and frees it once written.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config import ValidatedJob
from launcher.plan.memory import MemoryEstimate
from launcher.wire.training.speed import PINNED, is_async

# The share of the instance's memory left to the staging copies: the rest holds the OS, each
# rank's Python process and data loader, and the page cache the checkpoint files pass through.
HOST_STAGING_SHARE = 0.8
STAGED_TERMS = ("parameters", "optimizer")


@dataclass(frozen=True)
class HostStaging:
    mode: str
    per_rank_gib: float
    ranks_per_host: int
    host_memory_gib: float | None  # the instance's memory (catalog); None when unknown

    @property
    def per_host_gib(self) -> float:
        return self.per_rank_gib * self.ranks_per_host

    @property
    def usable_gib(self) -> float | None:
        return None if self.host_memory_gib is None else self.host_memory_gib * HOST_STAGING_SHARE

    @property
    def fits(self) -> bool | None:
        return None if self.usable_gib is None else self.per_host_gib <= self.usable_gib

    def text(self) -> str:
        held = "pinned, held for the whole run" if self.mode == PINNED else "allocated at each save"
        head = (f"checkpoint staging ({self.mode}): {self.per_rank_gib:.2f} GiB of host memory per rank "
                f"(its parameter and optimizer shards, {held}) x {self.ranks_per_host} ranks = "
                f"{self.per_host_gib:.1f} GiB per host")
        if self.fits is None:
            return head + "; the instance's memory is unknown"
        verdict = "fits" if self.fits else "does NOT fit: use more hosts or a larger sharding group, or " \
                                           "checkpoint_async_mode: disabled"
        return (f"{head}, of {self.host_memory_gib:g} GiB ({HOST_STAGING_SHARE:.0%} = {self.usable_gib:.0f} GiB "
                f"for staging): {verdict}")

    def to_dict(self) -> dict:
        return {"mode": self.mode, "per_rank_gib": round(self.per_rank_gib, 3), "ranks_per_host": self.ranks_per_host,
                "per_host_gib": round(self.per_host_gib, 3), "host_memory_gib": self.host_memory_gib,
                "usable_gib": None if self.usable_gib is None else round(self.usable_gib, 3), "fits": self.fits}


def host_staging(job: ValidatedJob, memory: MemoryEstimate) -> HostStaging | None:
    """The staging memory of smlaunch's runtime with an asynchronous mode; None otherwise (a
    user's script's hyperparameter of that name is its own)."""
    mode = job.config.hyperparameters.checkpoint_async_mode
    if not job.kind.runtime or not is_async(mode) or job.processes_per_host is None:
        return None
    return HostStaging(mode, sum(memory.gib(key) for key in STAGED_TERMS), job.processes_per_host,
                       job.instance.memory_gib if job.instance else None)
