"""launcher.wire.opt_ml.free_port: rendezvous ports below the kernel's ephemeral range, where no
connection on the machine can take them as its source port between the draw and the agent's
listen (a local job's agents listen seconds after the draw: they import the runtime first), with
room above for the job's restart attempts (port + attempt). Sockets on 127.0.0.1 (~0.1 s)."""

from __future__ import annotations

import socket

import pytest

from launcher.wire import opt_ml
from launcher.wire.faults import MAX_RESTARTS


@pytest.fixture
def low() -> int:
    low = opt_ml.ephemeral_low()
    if low is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    return low


def test_a_drawn_port_is_free_and_below_the_ephemeral_range_with_room_for_every_attempt(low):
    for _ in range(20):
        port = opt_ml.free_port()
        assert opt_ml.LOWEST_RENDEZVOUS_PORT <= port and port + MAX_RESTARTS < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: a listener can take it
    with socket.socket() as s:  # control: the kernel's own pick is in the range the draw avoids
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] >= low


def test_a_port_in_use_is_drawn_again(low, monkeypatch):
    port = opt_ml.free_port()
    listener = socket.socket()
    listener.bind(("127.0.0.1", port))
    listener.listen()
    drawn = []
    real = opt_ml.random.SystemRandom()

    class Draw:  # the held port first, then the real draw
        def randrange(self, start, stop):
            drawn.append(port if not drawn else real.randrange(start, stop))
            return drawn[-1]

    monkeypatch.setattr(opt_ml.random, "SystemRandom", Draw)
    try:
        again = opt_ml.free_port()
    finally:
        listener.close()
    assert drawn[0] == port and again == drawn[-1] != port and len(drawn) >= 2


def test_without_the_kernels_range_the_kernel_picks(monkeypatch, tmp_path):
    monkeypatch.setattr(opt_ml, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert opt_ml.ephemeral_low() is None
    port = opt_ml.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
