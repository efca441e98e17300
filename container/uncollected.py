"""Imports with Python's cyclic collector off, then what they made frozen out of its reach.

Nothing an import makes is garbage, and the collector's passes over the growing heap were a third of
the agent template's import of the runtime (~2.8 -> ~1.9 CPU s here; BENCHMARKS.md). Frozen
(`gc.freeze`), the imported objects are never walked again, also not in a process forked after it.
For the processes that import the runtime once and then fork: the agent template
(container.distributed.zygote) and `python -m container trace`."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def uncollected() -> Iterator[None]:
    """The block's imports without the collector; afterwards (also after a failed import) what was
    imported is frozen and the collector is on."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
