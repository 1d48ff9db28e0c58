"""Events handed to the replica that holds a node's Lease (pure, no I/O).

With NODE_LEASES, a replica that received an event for a node whose Lease another holds writes it onto the Lease as
an annotation (:func:`annotation`); the holder joins it to its operation (:func:`events_in`), so its drain takes the
nearer end at once (DESIGN.md rule 13). The message stays with its receiver, which waits for the Lease."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

import structlog
from pydantic import TypeAdapter, ValidationError

from queue_processor.kinds import Event
from queue_processor.rules import RULES

__all__ = ["HANDOVER_PREFIX", "annotation", "events_in", "handed", "missing"]

log = structlog.get_logger("queue_processor.handover")

#: The annotation keys of events handed over: ``queue-processor/event.<event ID>`` (an event ID is at most 54
#: characters of ``[a-z0-9-]``, so the name part stays within the 63 an annotation key allows).
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
    """The events handed over in ``annotations`` (a Lease's) for ``instance_id``, in key order. A value that is
    not an event, or one whose ID is not its key's, is logged and left out: it was not written by us."""
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
