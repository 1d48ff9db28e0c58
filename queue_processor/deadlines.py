"""The deadline arithmetic of an operation (pure: the clocks' readings are arguments).

Two clocks meet here: AWS's (an event's ``time`` and ``start_time``, wall-clock, aware UTC, read against
``wall``) and the controller's monotonic one (``now``), on which every deadline is returned, so that a step of
the wall clock never moves a drain. DESIGN.md rule 13: an operation's deadline and instance end are the
earliest of every event it carries; the handler recomputes them when an event joins and keeps the nearer.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from queue_processor.events import EventKind
from queue_processor.kinds import AsgLaunchLifecycleEvent, Event, ScheduledChangeEvent

__all__ = ["drain_deadline", "instance_end", "launch_ready_deadline", "leaves_time", "notice_end"]


def leaves_time(events: Sequence[Event], *, grace_period_s: float, wall: datetime) -> bool:
    """Whether every one of ``events`` leaves time (DRAIN_BUDGET_NON_URGENT may make its drain wait its
    turn): a rebalance recommendation (a Spot instance at elevated risk, no notice yet), or an AWS Health
    scheduled change whose start is more than NODE_TERMINATION_GRACE_PERIOD (``grace_period_s``, the longest a
    drain takes) after ``wall``. Anything else (a Spot or Capacity Reservation notice, a terminate lifecycle
    action, a state change: the instance is going now) does not; neither does an empty list."""
    if not events:
        return False
    for event in events:
        if event.kind is EventKind.REBALANCE_RECOMMENDATION:
            continue
        if (
            isinstance(event, ScheduledChangeEvent)
            and (event.start_time - wall).total_seconds() > grace_period_s
        ):
            continue
        return False
    return True


def notice_end(events: Sequence[Event], *, now: float, wall: datetime, started_at: float) -> float | None:
    """The end (on ``now``'s clock) of the earliest Spot or Capacity Reservation notice among ``events``,
    ``None`` without one: their start time is when the instance goes. A notice already over by ``wall``
    (delivered late, or this clock runs ahead of AWS's) is measured from the operation's start
    (``started_at``, on ``now``'s clock) instead, with its own length (120 s for Spot): a drain cut to nothing
    could never succeed, and an instance that is really gone ends the retry as "instance gone"."""
    notices = [event for event in events if event.notice]
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
    """NODE_TERMINATION_GRACE_PERIOD (``grace_period_s``) from ``now``, and never past the end of the earliest
    Spot or Capacity Reservation notice (:func:`notice_end`). Other kinds (rebalance, state change, lifecycle
    actions, scheduled changes) never shorten a drain."""
    deadline = now + grace_period_s
    end = notice_end(events, now=now, wall=wall, started_at=started_at)
    return deadline if end is None else min(deadline, end)


def instance_end(events: Sequence[Event], *, now: float, wall: datetime, started_at: float) -> float | None:
    """When the instance goes (on ``now``'s clock), as far as ``events`` say: the end of a Spot or Capacity
    Reservation notice (:func:`notice_end`), or the start of an AWS Health scheduled change still to come, the
    earliest; ``None`` when no event says. Grace periods are cut to end GRACE_DEADLINE_MARGIN before it, and
    DELETE_AT_DEADLINE acts DELETE_AT_DEADLINE_LEAD before it."""
    ends = [
        end for end in (notice_end(events, now=now, wall=wall, started_at=started_at),) if end is not None
    ]
    for event in events:
        if isinstance(event, ScheduledChangeEvent) and event.start_time > wall:
            ends.append(now + (event.start_time - wall).total_seconds())
    return min(ends, default=None)


def launch_ready_deadline(events: Sequence[Event], *, timeout_s: float, now: float, wall: datetime) -> float:
    """When (on ``now``'s clock) the launch actions among ``events`` have waited LAUNCH_READY_TIMEOUT_SEC
    (``timeout_s``) for their node: measured from the earliest action's start (its event time), so every
    receive of a requeued message, every replica and a restarted controller agree; an action time ahead of
    ``wall`` counts as now."""
    started = min(
        (event.time for event in events if isinstance(event, AsgLaunchLifecycleEvent)), default=None
    )
    age = 0.0 if started is None else max((wall - started).total_seconds(), 0.0)
    return now + max(timeout_s - age, 0.0)
