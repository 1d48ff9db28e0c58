"""The node Lease's guard around a step (:func:`queue_processor.steps.lease_guard`): a Lease lost while the step
runs cancels it and raises ``ClaimLost``; a step that ends first keeps its result, and a step a shutdown is
already cancelling finishes its cleanup undisturbed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from queue_processor.outcomes import ClaimLost
from queue_processor.steps import lease_guard


def guarded() -> Any:
    """An operation's context as the guard reads it: its node and its claim (``lost`` set when the Lease is)."""
    return SimpleNamespace(claim=SimpleNamespace(lost=asyncio.Event(), name="lease-a"), node="a")


async def turns() -> None:
    """Let the loop run a few turns (nothing here waits on time: this measures nothing)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_lease_lost_while_the_step_waits_cancels_it() -> None:
    ctx = guarded()
    asyncio.get_running_loop().call_soon(ctx.claim.lost.set)
    with pytest.raises(ClaimLost):
        async with lease_guard(ctx):
            await asyncio.Event().wait()
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_step_that_ends_as_the_lease_is_lost_keeps_its_result() -> None:
    """Both in one turn of the loop, the Lease's loss first: the step's work is done (PostDrain completed the
    lifecycle actions), so its result stands rather than a requeue of a finished operation."""
    ctx = guarded()
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def both() -> None:
        ctx.claim.lost.set()
        done.set_result("done")

    asyncio.get_running_loop().call_soon(both)
    async with lease_guard(ctx):
        outcome = await done
    assert outcome == "done"


async def test_a_lease_lost_while_a_shutdown_cancels_the_step_leaves_its_cleanup_alone() -> None:
    """SIGTERM cancels the step; its cleanup (a surge taken back, a write's answer awaited) is still running
    when the Lease lapses: the cleanup is not cancelled a second time."""
    ctx = guarded()
    cleanup: list[str] = []
    written = asyncio.Event()

    async def step() -> None:
        async with lease_guard(ctx):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                try:
                    await written.wait()
                    cleanup.append("finished")
                except asyncio.CancelledError:
                    cleanup.append("interrupted")
                raise

    running = asyncio.create_task(step())
    await turns()
    running.cancel()  # the shutdown
    await turns()
    ctx.claim.lost.set()  # the Lease lapses during the cleanup
    await turns()
    written.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cleanup == ["finished"]
