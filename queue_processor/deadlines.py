"""The deadline arithmetic of an operation (pure: the clocks' readings are arguments).

Event times are AWS's wall clock (aware UTC, read against ``wall``); deadlines are returned on the monotonic clock
(``now``), so a wall-clock step never moves a drain. The earliest event wins (DESIGN.md rule 13).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from queue_processor.kinds import AsgLaunchLifecycleEvent, Event, ScheduledChangeEvent
from queue_processor.rules import RULES

__all__ = ["drain_deadline", "instance_end", "launch_ready_deadline", "leaves_time", "notice_end"]


def leaves_time(events: Sequence[Event], *, grace_period_s: float, wall: datetime) -> bool:
    """Whether every one of ``events`` (at least one) leaves time for DRAIN_BUDGET_NON_URGENT
    (:data:`~queue_processor.rules.RULES`): always, or when its start is over ``grace_period_s`` after ``wall``."""
    if not events:
        return False
    for event in events:
        rule = RULES[event.kind].leaves_time
        far = (event.start_time - wall).total_seconds() > grace_period_s
        if not (rule == "always" or (rule == "when-far" and far)):
            return False
    return True


def notice_end(events: Sequence[Event], *, now: float, wall: datetime, started_at: float) -> float | None:
    """The end (on ``now``'s clock) of the earliest Spot or Capacity Reservation notice, ``None`` without one; one
    over by ``wall`` is measured from ``started_at`` with its own length (a drain cut to nothing never succeeds)."""
    notices = [event for event in events if RULES[event.kind].notice]
    if not notices:
        return None
    first = min(notices, key=lambda event: event.start_time)
    left = (first.start_time - wall).total_seconds()
    if left <= 0:
        length = (first.start_time - first.time).total_seconds()
        left = length - (now - started_at)
    return now + max(left, 0.0)


def drain_deadline(
    events: Sequence[Event], *, grace_period_s: float, now: float, wall: datetime, started_at: float
) -> float:
    """``grace_period_s`` (NODE_TERMINATION_GRACE_PERIOD) from ``now``, never past :func:`notice_end`."""
    deadline = now + grace_period_s
    end = notice_end(events, now=now, wall=wall, started_at=started_at)
    return deadline if end is None else min(deadline, end)


def instance_end(events: Sequence[Event], *, now: float, wall: datetime, started_at: float) -> float | None:
    """When the instance goes (on ``now``'s clock): the earliest of :func:`notice_end` and the start of a scheduled
    change still to come; ``None`` when no event says."""
    ends = [
        end for end in (notice_end(events, now=now, wall=wall, started_at=started_at),) if end is not None
    ]
    for event in events:
        if isinstance(event, ScheduledChangeEvent) and event.start_time > wall:
            ends.append(now + (event.start_time - wall).total_seconds())
    return min(ends, default=None)


def launch_ready_deadline(events: Sequence[Event], *, timeout_s: float, now: float, wall: datetime) -> float:
    """When (on ``now``'s clock) the launch actions have waited ``timeout_s`` (LAUNCH_READY_TIMEOUT_SEC) for their
    node, from the earliest action's event time (every replica agrees; one ahead of ``wall`` counts as now)."""
    started = min(
        (event.time for event in events if isinstance(event, AsgLaunchLifecycleEvent)), default=None
    )
    age = 0.0 if started is None else max((wall - started).total_seconds(), 0.0)
    return now + max(timeout_s - age, 0.0)
