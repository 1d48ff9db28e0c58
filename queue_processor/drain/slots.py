"""How many evictions wait for their first request at once, across every drain (:class:`Slots`).

In a storm every drain starts at once: a thousand nodes of ten pods are ten thousand evictions, and the client's
QPS (KUBE_API_QPS) serves them one after the other over about a minute. An eviction started as a task waits in
the rate limiter's line as a chain of suspended coroutines (~2 KB each: 18 MiB for ten thousand). So a drain
starts its evictions as slots free up: the pods not started yet wait as data (the drain's plan), and the
limiter's line holds no more than a few seconds of its tokens. Drains take slots first come first served, as
many as are free up to the pods they have left, so the node whose drain started first is drained first, as
when every eviction of every drain queued at the limiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

__all__ = ["Slot", "Slots", "evictions_in_flight"]

#: The fewest slots, whatever the QPS.
LEAST_SLOTS = 64


def evictions_in_flight(qps: float, burst: int) -> int:
    """The slots for a client of ``qps`` requests per second and ``burst`` saved up (KUBE_API_QPS,
    KUBE_API_BURST): two seconds of tokens and the burst, at least :data:`LEAST_SLOTS`. Fewer would leave tokens
    unused while an eviction's answer is on its way back; more is memory spent on waiting."""
    return max(LEAST_SLOTS, int(2 * qps), burst)


class Slots:
    """A first-come-first-served counting gate of ``size`` slots (> 0): :meth:`take` waits until it is at the
    head of the line and a slot is free, and takes as many as it may; :meth:`give` returns them. Single event
    loop; not thread-safe."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.size = size
        self.free = size
        self._line: deque[tuple[int, asyncio.Future[int]]] = deque()

    async def take(self, wanted: int) -> int:
        """Wait behind every caller that came before until a slot is free, then take as many as are free, up
        to ``wanted`` (≥ 1), and return how many (so the slots are never left unused while callers wait, and
        the first caller's are served before the next's). A caller cancelled while it waits takes none (one
        cancelled just after its turn came gives them back). Raises ``CancelledError`` then."""
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
        """Return ``count`` slots taken with :meth:`take`; the callers at the head of the line they now cover
        get their turn."""
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
    """One slot of ``slots`` held by one eviction until its first request is answered: :meth:`release` gives it
    back once (later calls do nothing)."""

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
