"""EC2 Instance State-change Notification → :class:`StateChangeEvent` ("EC2 instance state-change events").
Only :data:`DRAIN_STATES` are acted on, matched exactly (aws-node-termination-handler matched substrings).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from queue_processor.events import BaseEvent, EventKind, NonEmptyStr, SqsMessageRef, detail_alias
from queue_processor.kinds.base import ParseResult, register
from queue_processor.outcomes import SkipClass


class StateChangeEvent(BaseEvent):
    """An instance state change (``detail.state``); ``start_time = time``."""

    detail_type: Literal["EC2 Instance State-change Notification"] = Field(
        default="EC2 Instance State-change Notification", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.STATE_CHANGE] = EventKind.STATE_CHANGE
    instance_id: NonEmptyStr = Field(validation_alias=detail_alias("instance-id"))
    state: NonEmptyStr = Field(validation_alias=detail_alias("state"))


#: Instance states after which the node will not come back as it was.
DRAIN_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


@register("aws.ec2", StateChangeEvent)
def finish_state_change(
    event: StateChangeEvent, message: SqsMessageRef | None
) -> ParseResult[StateChangeEvent]:
    """The event for a state in :data:`DRAIN_STATES`, a skip for any other state."""
    if event.state not in DRAIN_STATES:
        return ParseResult.skip(SkipClass.UNHANDLED_STATE, f"instance state {event.state!r} is not acted on")
    return ParseResult.of_events((event,))
