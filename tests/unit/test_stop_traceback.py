"""A stop is no crash (container/toolkit/stop_traceback.py): once the bootstrap has forwarded a
stop, torch elastic's traceback of that SIGTERM leaves torchrun's stderr; its other lines, any other
traceback, and the same traceback without a stop (someone else signalled torchrun) are shown.
tests/integration/test_local_progress.py stops a two-rank job and reads its log."""

from __future__ import annotations

from container.toolkit.stop_traceback import StopTraceback

AGENT = b"W1127 05:48:32.482000 19209 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal\n"
SIGNAL_TRACEBACK = (
    b"Traceback (most recent call last):\n"
    b'  File "<frozen runpy>", line 198, in _run_module_as_main\n'
    b'  File ".../torch/distributed/launcher/api.py", line 374, in launch_agent\n'
    b"    result = agent.run()\n"
    b"             ^^^^^^^^^^^\n"
    b'  File ".../torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler\n'
    b'    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)\n'
    b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 19209 got signal: 15\n"
)
OTHER_TRACEBACK = (b"Traceback (most recent call last):\n"
                   b'  File ".../torch/distributed/run.py", line 1028, in main\n'
                   b"RuntimeError: rendezvous failed\n")


def shown(stream: bytes, stopping: bool, size: int = 7) -> bytes:
    """What the filter lets through of `stream`, fed in chunks of `size` bytes (lines cut anywhere)."""
    quiet = StopTraceback(lambda: stopping)
    out = b"".join(quiet.feed(stream[i:i + size]) for i in range(0, len(stream), size))
    return out + quiet.feed(b"", final=True)


def test_a_stops_signal_traceback_is_dropped_and_everything_else_kept():
    stream = AGENT + SIGNAL_TRACEBACK + b"after\n"
    assert shown(stream, stopping=True) == AGENT + b"after\n"
    assert shown(stream, stopping=True, size=len(stream)) == AGENT + b"after\n"
    assert shown(stream, stopping=False) == stream  # control: no stop was forwarded, torchrun's account stands
    assert shown(AGENT + OTHER_TRACEBACK, stopping=True) == AGENT + OTHER_TRACEBACK  # another failure: whole


def test_an_unfinished_line_or_traceback_is_shown_at_the_end():
    assert shown(b"progress 10%\rprogress 20%", stopping=True) == b"progress 10%\rprogress 20%"
    cut = SIGNAL_TRACEBACK[:120]  # the stream ended before the exception line: nothing proves it a stop's
    assert shown(cut, stopping=True) == cut
