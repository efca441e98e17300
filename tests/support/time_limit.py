"""A wall-clock limit for code that might never return (a FIFO opened for reading, a loop)."""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def time_limit(seconds: int):
    """Raise TimeoutError in the main thread after `seconds`, so the test fails instead of hanging."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
