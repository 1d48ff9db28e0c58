"""When a drain must end: its deadline and its instance's end, which only ever come nearer."""

from __future__ import annotations

import asyncio
import contextlib

from queue_processor.drain.plan import DrainTiming


class DrainBounds:
    """When a drain must end, only ever tightened (DESIGN.md rule 13): ``deadline`` and ``instance_end`` (``clock``
    readings; ``None``: unknown). The running drain picks up a :meth:`tighten` at once: waits wake, graces are cut
    again, waves and the deadline step re-planned. One asyncio loop owns it."""

    def __init__(self, deadline: float, instance_end: float | None = None) -> None:
        self.deadline = deadline
        self.instance_end = instance_end
        self.version = 0
        """How many times the bounds tightened."""
        self._tightened = asyncio.Event()

    def tighten(self, deadline: float, instance_end: float | None) -> bool:
        """Take the nearer of each bound; ``True`` (and every waiter woken) when one moved."""
        moved = False
        if deadline < self.deadline:
            self.deadline, moved = deadline, True
        if instance_end is not None and (self.instance_end is None or instance_end < self.instance_end):
            self.instance_end, moved = instance_end, True
        if moved:
            self.version += 1
            woken, self._tightened = self._tightened, asyncio.Event()
            woken.set()
        return moved

    def final(self, timing: DrainTiming) -> tuple[float, bool]:
        """The last moment the drain waits for (a ``clock`` reading) and whether the deadline step ends it: with
        DELETE_AT_DEADLINE, DELETE_AT_DEADLINE_LEAD before the instance's end if that precedes the deadline."""
        end = self.instance_end
        if timing.delete_at_deadline and end is not None and end - timing.delete_lead_s <= self.deadline:
            return end - timing.delete_lead_s, True
        return self.deadline, False

    async def sleep(self, seconds: float, *, wake: asyncio.Event | None = None) -> bool:
        """Wait ``seconds``, less if the bounds tighten (or ``wake`` is set); ``True`` when they tightened."""
        tightened = self._tightened
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                if wake is None:
                    await tightened.wait()
                else:
                    waits = [asyncio.ensure_future(tightened.wait()), asyncio.ensure_future(wake.wait())]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for task in waits:
                            task.cancel()
        return tightened.is_set()

    async def tightening(self) -> None:
        """Wait until the bounds tighten next."""
        await self._tightened.wait()
