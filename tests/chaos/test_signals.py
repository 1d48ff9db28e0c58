"""Chaos, part one: the controller as a separate process (`queue-processor run`) against the sandbox, stopped
mid-drain by SIGTERM or SIGKILL, then started again. What a user checks: the process exits within its bound,
messages are visible again (at once after SIGTERM, after their visibility timeout after SIGKILL), nothing
heartbeats after the exit, and the restarted controller finishes the work: every lifecycle action completed,
none timed out, no DaemonSet pod evicted, nothing left in the queue, no node drained twice (the judge).

Sizes for 2 cores: 4 nodes, 3 of them leaving through terminate lifecycle hooks whose drains a
PodDisruptionBudget holds until the test lets go.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_processor_sandbox.environment import Sandbox
from tests.chaos.harness import DRAINING, LEAVING, Draining, heartbeats, queue_depth, sandbox_on
from tests.conftest import KUBERNETES


@pytest.fixture(params=KUBERNETES)
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    with sandbox_on(request, DRAINING, tmp_path / "sandbox") as running:
        yield running


async def test_sigterm_mid_drain_exits_in_bound_with_every_message_visible_and_a_restart_finishes(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    draining = Draining(sandbox, tmp_path)
    first = await draining.first()
    status = first.stop(signal.SIGTERM, 10 + 20)  # SHUTDOWN_TIMEOUT_SEC, and room for a loaded machine
    assert status == 0, first.lines()[-5:]
    first.assert_clean_exit()
    assert queue_depth(sandbox) == (LEAVING, 0)  # visible again at once, none taken by a stray poll
    beats = heartbeats(sandbox)
    await asyncio.sleep(2.0)
    assert heartbeats(sandbox) == beats, "a heartbeat after the controller exited"
    assert queue_depth(sandbox) == (LEAVING, 0)
    assert [sandbox.aws.action(token).status for token in draining.tokens] == ["open"] * LEAVING
    await draining.finish()


async def test_sigkill_mid_drain_and_a_restart_finishes_the_work(sandbox: Sandbox, tmp_path: Path) -> None:
    draining = Draining(sandbox, tmp_path)
    first = await draining.first()
    assert first.stop(signal.SIGKILL, 30) == -signal.SIGKILL
    assert queue_depth(sandbox) == (0, LEAVING)  # hidden until their visibility timeout (10 s)
    await draining.finish()


@pytest.mark.parametrize("replicas", [2, 3])
async def test_replicas_with_leases_one_killed_mid_drain_the_others_finish(
    sandbox: Sandbox, tmp_path: Path, replicas: int
) -> None:
    namespace = sandbox.env().get("POD_NAMESPACE", "default")
    leases = {"NODE_LEASES": "true", "NODE_LEASE_DURATION_SEC": "15", "POD_NAMESPACE": namespace}
    draining = Draining(sandbox, tmp_path)
    first = await draining.first(POD_NAME="replica-0", **leases)
    others = [draining.controller(POD_NAME=f"replica-{n}", **leases) for n in range(1, replicas)]
    assert first.stop(signal.SIGKILL, 30) == -signal.SIGKILL  # its Leases lapse, its messages come back
    await draining.finish(*others)
