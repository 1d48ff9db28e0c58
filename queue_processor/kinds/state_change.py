"""EC2 Instance State-change Notification → :class:`~queue_processor.events.StateChangeEvent`.

Format: "EC2 instance state-change events" in the EC2 User Guide: source ``aws.ec2``, detail
``{"instance-id": "i-…", "state": "pending|running|stopping|stopped|shutting-down|terminated"}``.
Only the states in :data:`DRAIN_STATES` are acted on, matched exactly (aws-node-termination-handler matched
substrings); the others are skipped. ``start_time = time``.
"""

from queue_processor.events import SqsMessageRef, StateChangeEvent
from queue_processor.kinds.base import ParseResult, register

#: Instance states after which the node will not come back as it was.
DRAIN_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


@register("aws.ec2", StateChangeEvent)
def finish_state_change(event: StateChangeEvent, message: SqsMessageRef | None) -> ParseResult:
    """The event for a state in :data:`DRAIN_STATES`, a skip for any other state."""
    if event.state not in DRAIN_STATES:
        return ParseResult.skip(f"instance state {event.state!r} is not acted on")
    return ParseResult.of_events((event,))
