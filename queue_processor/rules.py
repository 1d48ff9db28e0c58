"""Per kind of event, pure (as Karpenter's ``actionForMessage``): the table :data:`RULES`, and the events handed to
the holder of a node's Lease. With NODE_LEASES, a replica that cannot claim a node writes the events that bring its
end nearer onto the Lease (:func:`annotation`); the holder joins them (:func:`events_in`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, Literal

import structlog
from pydantic import TypeAdapter, ValidationError

from queue_processor.events import Event, EventKind

log = structlog.get_logger("queue_processor.rules")


@dataclass(frozen=True)
class KindRules:
    """The rules of one kind. ``pre_drain``: NTH gives it a PreDrain task (its taint goes out with the cordon);
    ``taint_key``: NTH's taint key (TAINT_NODE; value: the event ID), ``None``: never tainted; ``notice``: its start
    time is when the instance is reclaimed (a deadline); ``leaves_time``: ``always``, ``when-far`` (its start more
    than NODE_TERMINATION_GRACE_PERIOD away) or ``never``; ``handed_over``: a replica that cannot claim the node
    hands it to the Lease's holder (not a lifecycle action: its heartbeats stay with its message)."""

    pre_drain: bool
    taint_key: str | None
    notice: bool
    leaves_time: Literal["always", "when-far", "never"]
    handed_over: bool


#: NTH's taint keys are a contract other projects key on (tests/peers/test_taint_contract.py).
RULES: dict[EventKind, KindRules] = {
    EventKind.SPOT_INTERRUPTION: KindRules(
        True, "aws-node-termination-handler/spot-itn", notice=True, leaves_time="never", handed_over=True
    ),
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: KindRules(  # NTH counts it as Spot for PreDrain
        True,
        "aws-node-termination-handler/capacity-reservation-interruption",
        notice=True,
        leaves_time="never",
        handed_over=True,
    ),
    EventKind.REBALANCE_RECOMMENDATION: KindRules(
        True,
        "aws-node-termination-handler/rebalance-recommendation",
        notice=False,
        leaves_time="always",
        handed_over=False,
    ),
    EventKind.SCHEDULED_CHANGE: KindRules(
        True,
        "aws-node-termination-handler/scheduled-maintenance",
        notice=False,
        leaves_time="when-far",
        handed_over=True,
    ),
    EventKind.ASG_TERMINATE_LIFECYCLE: KindRules(
        True,
        "aws-node-termination-handler/asg-lifecycle-termination",
        notice=False,
        leaves_time="never",
        handed_over=False,
    ),
    EventKind.ASG_LAUNCH_LIFECYCLE: KindRules(
        False, None, notice=False, leaves_time="never", handed_over=False
    ),
    EventKind.STATE_CHANGE: KindRules(False, None, notice=False, leaves_time="never", handed_over=True),
}


def leaves_time(events: Sequence[Event], *, grace_period_s: float, wall: datetime) -> bool:
    """Whether all ``events`` (≥ 1) leave time for DRAIN_BUDGET_NON_URGENT (start > ``wall + grace_period_s``)."""
    if not events:
        return False
    for event in events:
        rule = RULES[event.kind].leaves_time
        far = (event.start_time - wall).total_seconds() > grace_period_s
        if not (rule == "always" or (rule == "when-far" and far)):
            return False
    return True


#: Events handed over: ``queue-processor/event.<event ID>`` (IDs ≤ 54 characters: the name part stays within 63).
HANDOVER_PREFIX = "queue-processor/event."


@cache
def _events() -> TypeAdapter[Any]:
    return TypeAdapter(Event)


def handed(event: Event) -> bool:
    """Whether ``event`` is handed to the holder (:class:`~queue_processor.rules.KindRules`' ``handed_over``)."""
    return RULES[event.kind].handed_over


def annotation(event: Event) -> tuple[str, str]:
    """The annotation that hands ``event`` over: its key and its value (its fields as compact JSON, no SQS message)."""
    fields = event.model_dump(mode="json", exclude={"message", "event_id", "start_time"})
    fields["detail-type"] = event.detail_type  # part of the identity of an event without a source ID
    return HANDOVER_PREFIX + event.event_id, json.dumps(fields, separators=(",", ":"), sort_keys=True)


def events_in(annotations: Mapping[str, str] | None, instance_id: str) -> list[Event]:
    """The events handed over in Lease ``annotations`` for ``instance_id``, by key; bad ones are logged, left out."""
    found: list[Event] = []
    for key in sorted(annotations or {}):
        if not key.startswith(HANDOVER_PREFIX):
            continue
        try:
            event = _events().validate_json((annotations or {})[key])
        except ValidationError as exc:
            log.warning("an event handed over cannot be read: left out", key=key, error=str(exc))
            continue
        if HANDOVER_PREFIX + event.event_id != key:
            log.warning("an event handed over does not match its key: left out", key=key)
            continue
        if event.instance_id == instance_id:
            found.append(event)
    return found


def missing(events: Iterable[Event], annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The annotations handing over those of ``events`` that :func:`handed` names and ``annotations`` lack."""
    present = annotations or {}
    return dict(
        pair for pair in (annotation(event) for event in events if handed(event)) if pair[0] not in present
    )
