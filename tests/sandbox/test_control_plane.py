"""The real control plane's own start-up (``queue_processor_sandbox.control_plane``): a port chosen free and taken
by another process before a component bound it (another test worker's plane, moto, a controller) is chosen
again, instead of failing the run."""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest

from queue_processor_sandbox import control_plane as module
from queue_processor_sandbox.control_plane import ControlPlane


def test_a_port_taken_before_the_api_server_binds_it_is_chosen_again(
    control_plane: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # control_plane: the binaries are there (this test starts a plane of its own)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        chosen: list[int] = []
        real = module.free_port

        def free_port() -> int:
            chosen.append(real() if len(chosen) != 2 else port)  # the third is the API server's
            return chosen[-1]

        monkeypatch.setattr(module, "free_port", free_port)
        plane = ControlPlane()
        try:
            plane.start()
            assert plane.port != port
            assert plane.request("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default"
        finally:
            plane.stop()
    assert port in chosen


def test_free_ports_are_below_the_ephemeral_range_and_random_whatever_the_seed() -> None:
    # An outgoing connection's local port comes from the ephemeral range: a port chosen there could be taken
    # before its listener binds it (a restarted controller once failed so). Test workers seed `random` alike.
    low = module._ephemeral_low()
    if low < 12000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it, the kernel picks")
    drawn = []
    for _ in range(5):
        random.seed(7)
        drawn.append(module.free_port())
    assert all(port < low for port in drawn)
    assert len(set(drawn)) > 1
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", drawn[-1]))  # still free
