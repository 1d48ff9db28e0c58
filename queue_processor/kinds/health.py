"""AWS Health ``scheduledChange`` events for EC2 → one :class:`ScheduledChangeEvent` per affected instance.

Format: "Monitoring AWS Health events with Amazon EventBridge". Unlike aws-node-termination-handler, which
drains only the first, every affected instance gets an event.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import lru_cache
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, computed_field

from queue_processor.events import BaseEvent, EventKind, SqsMessageRef, cached_field
from queue_processor.kinds.base import EventBridgeMessage, ParseResult, Poison, register
from queue_processor.outcomes import PoisonClass, SkipClass


class ScheduledChangeEvent(BaseEvent):
    """One affected instance of an AWS Health EC2 ``scheduledChange`` event; the identity key is ``event_arn``."""

    kind: Literal[EventKind.SCHEDULED_CHANGE] = EventKind.SCHEDULED_CHANGE
    scheduled_start_time: AwareDatetime
    end_time: AwareDatetime | None = None
    event_arn: str | None = None
    event_type_code: str | None = None
    #: The EventBridge envelope's ``id`` (NTH names the event after it; ``source_id`` is the ``eventArn``).
    eventbridge_id: str | None = None

    def _identity_key(self) -> str:
        return self.event_arn or super()._identity_key()

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """The Health event's ``startTime``."""
        return self.scheduled_start_time


class AffectedEntity(BaseModel):
    """One ``affectedEntities`` item; ``entityValue`` is the instance ID for EC2 events."""

    model_config = ConfigDict(frozen=True)

    entity_value: str | None = Field(default=None, alias="entityValue")


class HealthDetail(BaseModel):
    """The ``detail`` of an AWS Health event (the fields used here)."""

    model_config = ConfigDict(frozen=True)

    service: str | None = None
    event_type_category: str | None = Field(default=None, alias="eventTypeCategory")
    event_type_code: str | None = Field(default=None, alias="eventTypeCode")
    event_arn: str | None = Field(default=None, alias="eventArn")
    status_code: str | None = Field(default=None, alias="statusCode")
    start_time: str | None = Field(default=None, alias="startTime")
    end_time: str | None = Field(default=None, alias="endTime")
    affected_entities: list[AffectedEntity] | None = Field(default=None, alias="affectedEntities")


class HealthMessage(EventBridgeMessage):
    """An AWS Health event as EventBridge delivers it."""

    detail_type: Literal["AWS Health Event"] = Field(alias="detail-type")
    resources: list[str] | None = None
    detail: HealthDetail


_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


@lru_cache(maxsize=256)
def parse_health_time(value: str) -> datetime:
    """An AWS Health time, RFC 1123 or ISO 8601, as an aware datetime; ``ValueError`` when it is neither."""
    text = value.strip()
    if text[:1].isdigit():
        parsed = datetime.fromisoformat(text)
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    parts = text.split()
    # The layout AWS Health uses, read directly: email.utils' general parser is much slower.
    if len(parts) == 6 and parts[5] == "GMT" and parts[2] in _MONTHS and parts[4].count(":") == 2:
        hour, minute, second = parts[4].split(":")
        try:
            return datetime(
                int(parts[3]),
                _MONTHS[parts[2]],
                int(parts[1]),
                int(hour),
                int(minute),
                int(second),
                tzinfo=UTC,
            )
        except ValueError:
            pass
    try:
        parsed = parsedate_to_datetime(text)
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    except (TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"{value!r} is neither RFC 1123 nor ISO 8601") from exc


def _instance_id(value: str) -> str:
    # An instance ARN (arn:aws:ec2:region:account:instance/i-…) names the instance after "instance/".
    marker = ":instance/"
    return value.split(marker, 1)[1] if marker in value else value


def _affected_instances(msg: HealthMessage) -> list[str]:
    entities = msg.detail.affected_entities
    values = (
        [entity.entity_value for entity in entities] if entities is not None else list(msg.resources or ())
    )
    instances: dict[str, None] = {}
    for value in values:
        if value and value.strip():
            instances[_instance_id(value.strip())] = None
    return list(instances)


def _time_field(name: str, value: str) -> datetime:
    try:
        return parse_health_time(value)
    except ValueError as exc:
        raise Poison(PoisonClass.INVALID_FIELD, f"detail.{name}: {exc}") from None


@register("aws.health", HealthMessage)
def finish_health(msg: HealthMessage, message: SqsMessageRef | None) -> ParseResult[ScheduledChangeEvent]:
    """One :class:`ScheduledChangeEvent` per affected instance of an open EC2 ``scheduledChange``, else a skip.
    Raises :class:`Poison` without a readable ``time`` / ``startTime`` or an affected instance."""
    health = msg.detail
    if health.service != "EC2":
        return ParseResult.skip(
            SkipClass.UNHANDLED_HEALTH_EVENT,
            f"AWS Health event for service {health.service!r} is not acted on",
        )
    if health.event_type_category != "scheduledChange":
        return ParseResult.skip(
            SkipClass.UNHANDLED_HEALTH_EVENT,
            f"AWS Health event category {health.event_type_category!r} is not acted on",
        )
    if health.status_code == "closed":
        return ParseResult.skip(SkipClass.HEALTH_EVENT_CLOSED, "AWS Health event is closed")
    if health.start_time is None:
        raise Poison(PoisonClass.MISSING_FIELD, "detail.startTime: Field required")
    if msg.time is None:
        raise Poison(PoisonClass.MISSING_FIELD, "time: Field required")
    start_time = _time_field("startTime", health.start_time)
    end_time = _time_field("endTime", health.end_time) if health.end_time else None
    instances = _affected_instances(msg)
    if not instances:
        raise Poison(PoisonClass.MISSING_FIELD, "detail.affectedEntities: no affected instance")
    events: tuple[ScheduledChangeEvent, ...] = tuple(
        ScheduledChangeEvent(
            instance_id=instance_id,
            time=msg.time,
            scheduled_start_time=start_time,
            source_id=health.event_arn or msg.id,
            message=message,
            event_arn=health.event_arn,
            event_type_code=health.event_type_code,
            end_time=end_time,
            eventbridge_id=msg.id,
        )
        for instance_id in instances
    )
    return ParseResult.of_events(events)
