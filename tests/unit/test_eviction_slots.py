"""The gate that bounds the evictions waiting for their first answer across drains
(:class:`queue_processor.drain.evictions.Slots`): first come first served, a large request served whole, a caller
cancelled in line taking nothing and holding no one back."""

from __future__ import annotations

import asyncio

import pytest

from queue_processor.drain.evictions import LEAST_SLOTS, Slot, Slots, evictions_in_flight


def test_the_slots_are_two_seconds_of_tokens_and_the_burst_at_least() -> None:
    assert evictions_in_flight(200, 400) == 400
    assert evictions_in_flight(300, 100) == 600
    assert evictions_in_flight(5, 10) == LEAST_SLOTS
    with pytest.raises(ValueError, match="size"):
        Slots(0)


async def test_callers_are_served_in_the_order_they_came_with_as_many_as_are_free() -> None:
    slots = Slots(4)
    assert await slots.take_slots(3) == 3
    assert await slots.take_slots(5) == 1  # no one waits: what is free
    served: list[str] = []

    async def take(name: str, wanted: int) -> None:
        served.append(f"{name}:{await slots.take_slots(wanted)}")

    waiting = [asyncio.create_task(take(name, wanted)) for name, wanted in (("a", 10), ("b", 1), ("c", 2))]
    await asyncio.sleep(0)
    assert served == []
    slots.give(3)
    await asyncio.sleep(0)
    assert served == ["a:3"]  # the first gets every slot free, up to what it wants
    slots.give(2)
    await asyncio.gather(*waiting)
    assert served == ["a:3", "b:1", "c:1"]
    assert slots.free == 0


async def test_a_caller_cancelled_in_line_takes_nothing_and_lets_the_next_through() -> None:
    slots = Slots(1)
    assert await slots.take_slots(1) == 1
    first = asyncio.create_task(slots.take_slots(2))
    second = asyncio.create_task(slots.take_slots(1))
    await asyncio.sleep(0)
    first.cancel()
    slots.give(1)  # returned while the cancelled caller is still in line: it is skipped, not served
    assert await second == 1
    with pytest.raises(asyncio.CancelledError):
        await first
    assert slots.free == 0


async def test_a_caller_cancelled_as_its_turn_came_gives_the_slots_back() -> None:
    slots = Slots(1)
    assert await slots.take_slots(1) == 1
    waiter = asyncio.create_task(slots.take_slots(1))
    await asyncio.sleep(0)
    slots.give(1)  # its turn comes ...
    waiter.cancel()  # ... and it is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.free == 1


def test_a_slot_is_released_once() -> None:
    slots = Slots(3)
    slots.free = 2
    slot = Slot(slots)
    slot.release()
    slot.release()
    assert slots.free == 3
