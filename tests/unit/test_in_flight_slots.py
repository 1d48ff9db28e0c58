"""The in-flight slots (queue_processor/settlement.py): room reserved around a poll, claimed per message (keeping
its newest receipt handle), returned however the block exits, released once per message."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from queue_processor.events import SqsMessageRef
from queue_processor.settlement import InFlightSlots, Ledger


def ref(message_id: str, handle: str = "rh-1") -> SqsMessageRef:
    return SqsMessageRef(queue_url="q", message_id=message_id, receipt_handle=f"{handle}-{message_id}")


async def test_what_a_room_does_not_claim_is_free_again_when_it_exits() -> None:
    slots = InFlightSlots(4)
    async with slots.reserve_room(10) as room:
        assert room.size == 4
        assert slots.free == 0
        assert room.claim(ref("m-1"))
    assert (slots.held, slots.free) == (1, 3)


async def test_a_room_left_by_an_exception_or_a_cancellation_gives_everything_unclaimed_back() -> None:
    slots = InFlightSlots(3)

    async def failed_poll() -> None:
        async with slots.reserve_room(3) as room:
            room.claim(ref("m-1"))
            raise ValueError("a poll that failed")

    with pytest.raises(ValueError, match="a poll that failed"):
        await failed_poll()
    assert (slots.held, slots.free) == (1, 2)

    entered = asyncio.Event()

    async def poll() -> None:
        async with slots.reserve_room(3):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(poll())
    await entered.wait()
    assert slots.free == 0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert (slots.held, slots.free) == (1, 2)


async def test_a_slot_is_released_once_and_only_by_the_message_that_holds_it() -> None:
    slots = InFlightSlots(2)
    async with slots.reserve_room(2) as room:
        assert room.claim(ref("m-1"))
        assert not room.claim(ref("m-1"))  # received again while held: keeps the slot it has
    assert (slots.held, slots.free) == (1, 1)
    assert slots.release("m-1")
    assert not slots.release("m-1")  # a second release changes nothing
    assert not slots.release("never-held")
    assert (slots.held, slots.free) == (0, 2)


async def test_a_room_cannot_claim_more_than_it_reserved() -> None:
    slots = InFlightSlots(2)
    async with slots.reserve_room(1) as room:
        room.claim(ref("m-1"))
        with pytest.raises(RuntimeError):
            room.claim(ref("m-2"))
    assert (slots.held, slots.free) == (1, 1)


async def test_a_poller_waits_for_a_free_slot_and_takes_it_when_a_message_is_settled() -> None:
    slots = InFlightSlots(1)
    async with slots.reserve_room(1) as room:
        room.claim(ref("m-1"))
    got: list[int] = []

    async def poll() -> None:
        async with slots.reserve_room(10) as room:
            got.append(room.size)

    task = asyncio.create_task(poll())
    for _ in range(5):
        await asyncio.sleep(0)
    assert got == []
    assert slots.waiting == 1
    slots.release("m-1")
    await task
    assert got == [1]
    assert slots.waiting == 0
    assert slots.free == 1


def test_a_budget_below_one_slot_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        InFlightSlots(0)


async def test_a_held_message_keeps_its_newest_receipt_handle_until_its_slot_is_returned() -> None:
    slots = InFlightSlots(2)
    async with slots.reserve_room(2) as room:
        assert room.claim(ref("m-1", "rh-1"))
    async with slots.reserve_room(1) as room:
        assert not room.claim(ref("m-1", "rh-2"))  # received again while held: the new receipt wins
        assert room.unclaimed == 1
    held = slots.ref("m-1")
    assert held is not None
    assert held.receipt_handle == "rh-2-m-1"  # only the newest works (SQS DeleteMessage)
    assert slots.release("m-1")
    assert slots.ref("m-1") is None


async def test_a_message_whose_operation_ended_settles_after_the_renewal_batch_carrying_it() -> None:
    """A settlement waits for the renewal that carries its message; that renewal ends with the message's own
    batch of ten, not with the whole pass (at 2,000 held messages, 200 calls, each retried when throttled)."""
    calls: list[asyncio.Event] = []

    class Sqs:
        async def change_message_visibility_batch(self, **request: Any) -> dict[str, Any]:
            answered = asyncio.Event()
            calls.append(answered)
            await answered.wait()
            return {}

    refs = [SqsMessageRef(queue_url="q", message_id=f"m{i}", receipt_handle=f"h{i}") for i in range(30)]
    running = {ref.message_id for ref in refs}
    store = SimpleNamespace(in_flight=lambda message_id: message_id in running, actions_of=lambda _: [])
    heartbeats = SimpleNamespace(hold=lambda actions: None)
    ledger = Ledger(Sqs(), store, heartbeats, in_flight_budget=100, visibility_timeout_s=60)  # type: ignore[arg-type]
    ledger.held = lambda: list(refs)  # type: ignore[method-assign]
    renewal = asyncio.create_task(ledger.renew_held())
    await turns()
    assert len(calls) == 1  # the first batch (m0 to m9) is on its way
    carrying_m0 = ledger._extending["m0"]
    running.discard("m0")  # m0's operation ends meanwhile: its settlement waits for this renewal
    calls[0].set()
    await turns()
    assert carrying_m0.done()
    assert len(calls) == 2  # the pass goes on with the next batch
    while not renewal.done():
        for answered in calls:
            answered.set()
        await asyncio.sleep(0)


async def turns() -> None:
    """Let the loop run a few turns (the fakes answer at once: this measures nothing)."""
    for _ in range(20):
        await asyncio.sleep(0)
