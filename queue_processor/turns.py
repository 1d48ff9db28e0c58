"""Turns for drains that leave time (DRAIN_BUDGET_NON_URGENT): at most so many drains of one group at once.
Every drain of a group is counted while it runs (:meth:`Turns.turn`); one whose events all leave time waits,
cordoned, until fewer than :func:`turn_limit` run, in arrival order. Urgent drains are counted, never held."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from queue_processor import rest
from queue_processor.events import ScheduledChangeEvent
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.observe.webhook import ASG_TAG
from queue_processor.rules import leaves_time
from queue_processor.steps import OperationContext, taint_joined


def turn_limit(spec: str, group_size: int | None) -> int | None:
    """The most drains of a group at once for ``spec``: ``None`` for an empty spec, a count as is, or a percentage
    of ``group_size`` rounded down, at least 1 (1 when unknown). Raises ``ValueError`` otherwise."""
    spec = spec.strip()
    if not spec:
        return None
    if spec.endswith("%"):
        percent = int(spec[:-1])
        if not 0 < percent <= 100:
            raise ValueError(f"a percentage of 1 to 100, not {spec}")
        return 1 if group_size is None else max(1, math.floor(group_size * percent / 100))
    count = int(spec)
    if count < 1:
        raise ValueError(f"at least 1 drain at once, not {spec}")
    return count


class Turns:
    """Drains running per group and those waiting for a turn; ``observer`` gets ``drains_waiting{group}``."""

    def __init__(self, observer: Observer = NULL_OBSERVER) -> None:
        self.observer = observer
        self.running: Counter[str] = Counter()
        """Drains running now, per group."""
        self._lines: dict[str, list[asyncio.Event]] = {}  # per group, each waiter's wake-up, in arrival order
        self._limits: dict[asyncio.Event, int] = {}  # each waiter's limit

    def waiting(self, group: str) -> int:
        return len(self._lines.get(group, []))

    @asynccontextmanager
    async def turn(
        self,
        group: str,
        limit: int | None,
        *,
        urgent: Callable[[], bool],
        joined: asyncio.Event,
        waiting: Callable[[], Awaitable[None]] | None = None,
        recheck_s: Callable[[], float | None] = lambda: None,
    ) -> AsyncIterator[bool]:
        """Count a drain of ``group`` as running for the block; first, unless ``limit`` is ``None`` or ``urgent()``,
        wait while those running and ahead reach ``limit``, asking ``urgent()`` again when ``joined`` is set or after
        ``recheck_s()`` seconds; ``waiting()`` (idempotent) is awaited before each wait. Yields whether it waited."""
        waited = False
        counted = False
        if limit is not None and not urgent():
            line = self._lines.setdefault(group, [])
            me = asyncio.Event()
            line.append(me)
            self._limits[me] = limit
            try:
                while self.running[group] + line.index(me) >= limit and not urgent():
                    if not waited:
                        waited = True
                        self.observer.drains_waiting(group, len(line))
                    me.clear()
                    if waiting is not None:
                        await waiting()
                        if self.running[group] + line.index(me) < limit or urgent():
                            break  # its turn came, or an urgent event joined, while it got ready to wait
                    woken = rest.spawn(me.wait(), name=f"turn-{group}")
                    joining = rest.spawn(joined.wait(), name=f"turn-joined-{group}")
                    try:
                        await asyncio.wait(
                            {woken, joining}, timeout=recheck_s(), return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        await rest.stop(woken, joining)
                    joined.clear()
                self.running[group] += 1  # before those behind look again: its turn is taken
                counted = True
            finally:
                line.remove(me)
                del self._limits[me]
                if not line:
                    del self._lines[group]
                if waited:
                    self.observer.drains_waiting(group, self.waiting(group))
                self._wake(group)  # those behind it move up
        if not counted:
            self.running[group] += 1
        try:
            yield waited
        finally:
            self.running[group] -= 1
            if self.running[group] <= 0:
                del self.running[group]
            self._wake(group)

    def _wake(self, group: str) -> None:
        """Wake only the drains of ``group`` in line whose turn may have come (waking all is O(n²))."""
        running = self.running[group]
        for place, waiter in enumerate(self._lines.get(group, [])):
            if running + place < self._limits[waiter]:
                waiter.set()


@asynccontextmanager
async def drain_turn(
    ctx: OperationContext, turns: Turns, park: Callable[[list[str]], None]
) -> AsyncIterator[bool]:
    """DRAIN_BUDGET_NON_URGENT for an operation: count the drain in its node's group in ``turns``; when all its
    events leave time, first wait for a turn (cordoned, messages parked by ``park``, Lease kept) until an urgent event
    joins or a scheduled change is due. Yields whether it waited."""
    settings, operation = ctx.parts.settings, ctx.operation
    spec, grace = settings.drain_budget_non_urgent, settings.node_termination_grace_period

    def urgent() -> bool:
        return not leaves_time(operation.events, grace_period_s=grace, wall=datetime.now(UTC))

    def recheck_s() -> float | None:
        wall = datetime.now(UTC)
        due = [
            (event.start_time - wall).total_seconds() - grace
            for event in operation.events
            if isinstance(event, ScheduledChangeEvent)
        ]
        return max(min(due), 0.0) + 0.01 if due else None

    group, size = await node_group(ctx, sized=not urgent() and spec.strip().endswith("%"))
    limit = turn_limit(spec, size)
    logged = False

    async def waiting() -> None:
        nonlocal logged
        park(list(operation.messages))
        if not logged:
            logged = True
            ctx.log.info("waiting for a turn to drain: its events leave time", group=group, limit=limit)

    async with turns.turn(
        group, limit, urgent=urgent, joined=operation.joined, waiting=waiting, recheck_s=recheck_s
    ) as waited:
        if waited:
            ctx.log.info("a turn to drain came", group=group, urgent=urgent())
            await taint_joined(ctx)
        yield waited


async def node_group(ctx: OperationContext, *, sized: bool) -> tuple[str, int | None]:
    """The node's group for DRAIN_BUDGET_NON_URGENT and, when ``sized``, its size (``None``: unknown): its
    DRAIN_BUDGET_GROUP_LABEL value (sized from the watched copy of the nodes, never a LIST), else its Auto
    Scaling group (DescribeAutoScalingGroups); ``""`` for neither. Raises nothing but ``CancelledError``."""
    label, drainer = ctx.parts.settings.drain_budget_group_label, ctx.parts.drainer
    try:
        if label:
            watched = drainer.writes.nodes
            node = watched.get(ctx.node) if watched is not None else None
            if node is None:
                node = await drainer.kube.get_node(ctx.node)
            value = str(((node or {}).get("metadata") or {}).get("labels", {}).get(label, ""))
            if not value:
                return "", None
            size = watched.labelled(label, value) if sized and watched is not None else None
            return f"{label}={value}", size
        group = (ctx.info.tags if ctx.info is not None else {}).get(ASG_TAG, "")
        if not group or not sized:
            return group, None
        return group, await ctx.parts.heartbeats.lifecycle.group_size(group)
    except Exception as exc:
        ctx.log.warning("cannot read the node's group for DRAIN_BUDGET_NON_URGENT", error=repr(exc))
        return "", None
