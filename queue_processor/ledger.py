"""The in-flight budget as a ledger of slots: at most ``size`` messages held at once, each slot owned by one message
ID and keeping its newest receipt handle, so a slot is returned exactly once whatever raises, is cancelled or
repeats. A poll reserves room (``async with slots.room(10) as room``), each message kept claims one slot
(``room.claim(ref)``), the rest goes back when the block exits; :meth:`InFlightSlots.release` returns a claimed
slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from queue_processor.events import SqsMessageRef

__all__ = ["InFlightSlots", "Room"]


class Room:
    """Slots reserved for one poll (``size``); ``claim`` gives one to a message. Valid inside its ``async with``."""

    def __init__(self, slots: InFlightSlots, size: int) -> None:
        self._slots = slots
        self.size = size
        """Slots reserved (1 to the ``at_most`` asked for)."""
        self.unclaimed = size
        """Reserved slots no message claimed yet (returned when the block exits)."""

    def claim(self, ref: SqsMessageRef) -> bool:
        """Give a reserved slot to ``ref``'s message; ``False``, taking none, when it holds one already (its receipt
        handle becomes ``ref``'s). Raises ``RuntimeError`` when none is left or the block has exited."""
        held = self._slots._held
        if ref.message_id in held:
            held[ref.message_id] = ref
            return False
        if self.unclaimed <= 0:
            raise RuntimeError("no reserved slot left to claim")
        self.unclaimed -= 1
        held[ref.message_id] = ref
        return True


class InFlightSlots:
    """At most ``size`` (≥ 1) messages held at once (see the module docstring); one event loop."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"an in-flight budget of {size} slots: at least 1")
        self.size = size
        self._free = size
        self._held: dict[str, SqsMessageRef] = {}  # message ID → its newest receipt
        self._parked: set[str] = set()  # held messages that gave their slot back (park)
        self._waiters: list[asyncio.Future[None]] = []
        self.waiting = 0
        """Pollers waiting for a free slot now (liveness: they wait on purpose)."""

    @property
    def free(self) -> int:
        """Slots neither reserved nor held."""
        return self._free

    @property
    def held(self) -> int:
        """Slots held by messages (claimed, not released, not parked)."""
        return len(self._held) - len(self._parked)

    @property
    def parked(self) -> int:
        """Messages held without a slot (:meth:`park`)."""
        return len(self._parked)

    @asynccontextmanager
    async def room(self, at_most: int) -> AsyncIterator[Room]:
        """Wait until a slot is free, reserve up to ``at_most`` (≥ 1) and yield them as a :class:`Room`; every slot
        not claimed is free again on exit."""
        self.waiting += 1
        try:
            while self._free <= 0:
                woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.append(woken)
                try:
                    await woken
                finally:
                    if woken in self._waiters:
                        self._waiters.remove(woken)
        finally:
            self.waiting -= 1
        taken = min(self._free, max(1, at_most))
        self._free -= taken
        room = Room(self, taken)
        try:
            yield room
        finally:
            self._give_back(room.unclaimed)
            room.unclaimed = 0

    def park(self, message_id: str) -> bool:
        """Keep the message held, receipt too, but give its slot back (its operation waits for a turn). ``False``
        when it holds no slot or is parked already."""
        if message_id not in self._held or message_id in self._parked:
            return False
        self._parked.add(message_id)
        self._give_back(1)
        return True

    def ref(self, message_id: str) -> SqsMessageRef | None:
        """The newest receipt of a message holding a slot (``None`` for one that holds none)."""
        return self._held.get(message_id)

    def release(self, message_id: str) -> bool:
        """Return the slot ``message_id`` holds; ``False`` (no change) when it holds none."""
        if self._held.pop(message_id, None) is None:
            return False
        if message_id in self._parked:
            self._parked.discard(message_id)
        else:
            self._give_back(1)
        return True

    def check(self) -> None:
        """Raise ``RuntimeError`` unless 0 ≤ free and free + held ≤ size (a slot counted twice)."""
        if self._free < 0 or self._free + self.held > self.size:
            raise RuntimeError(f"in-flight slots miscounted: {self._free} free, {self.held} held")

    def _give_back(self, count: int) -> None:
        if count <= 0:
            return
        self._free += count
        self.check()
        self._wake()

    def _wake(self) -> None:
        """Wake every poller waiting for a slot; each checks again (the first may take them all)."""
        waiters, self._waiters = self._waiters, []
        for woken in waiters:
            if not woken.done():
                woken.set_result(None)
