"""How many evictions wait for their first request at once, across every drain (:class:`Slots`): the pods not started
wait as data, not as suspended tasks in the rate limiter's line; the drain started first goes first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

__all__ = ["Slot", "Slots", "evictions_in_flight"]

#: The fewest slots, whatever the QPS.
LEAST_SLOTS = 64


def evictions_in_flight(qps: float, burst: int) -> int:
    """The slots for KUBE_API_QPS ``qps`` and KUBE_API_BURST ``burst``: two seconds of tokens or the burst, at
    least :data:`LEAST_SLOTS`. Fewer leaves tokens unused while answers travel; more is memory spent waiting."""
    return max(LEAST_SLOTS, int(2 * qps), burst)


class Slots:
    """A first-come-first-served counting gate of ``size`` slots; ``ValueError`` when below 1. One event loop."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.size = size
        self.free = size
        self._line: deque[tuple[int, asyncio.Future[int]]] = deque()

    async def take(self, wanted: int) -> int:
        """Wait behind every earlier caller until a slot is free, then take as many as are free up to ``wanted``
        (≥ 1); how many. A caller cancelled while waiting takes none and raises ``CancelledError``."""
        wanted = max(1, wanted)
        if not self._line and self.free >= 1:
            count = min(wanted, self.free)
            self.free -= count
            return count
        turn: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (wanted, turn)
        self._line.append(entry)
        try:
            return await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give(turn.result())  # its turn came as it was cancelled: the slots go on
            else:
                with contextlib.suppress(ValueError):  # skipped already by _serve
                    self._line.remove(entry)
            raise

    def give(self, count: int = 1) -> None:
        """Return ``count`` slots taken with :meth:`take`, serving the head of the line."""
        self.free += count
        self._serve()

    def _serve(self) -> None:
        while self._line and self.free >= 1:
            wanted, turn = self._line.popleft()
            if turn.done():  # cancelled, its caller not yet resumed to leave the line: skipped
                continue
            count = min(wanted, self.free)
            self.free -= count
            turn.set_result(count)


class Slot:
    """One slot of ``slots``, held by one eviction until its first request is answered."""

    __slots__ = ("_slots",)

    def __init__(self, slots: Slots) -> None:
        self._slots: Slots | None = slots

    def release(self) -> None:
        """Give the slot back, the first time only."""
        if self._slots is not None:
            self._slots.give(1)
            self._slots = None

    def ended(self, _task: object) -> None:
        """:meth:`release`, as a done callback of the eviction's task (which may be cancelled before it runs)."""
        self.release()
