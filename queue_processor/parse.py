"""Message body → typed events: ``parse(body) -> ParseResult``, pure and total. Accepted: an EventBridge
event of a kind in :data:`REGISTRY`, an Auto Scaling notification sent straight to SQS, or either in an SNS
envelope ("Amazon SNS message and JSON formats"), validated straight from JSON. AWS Health ``scheduledChange``
events ("Monitoring AWS Health events with Amazon EventBridge") give one event per affected instance; state changes
are acted on for :data:`DRAIN_STATES` only, matched exactly."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import cache, lru_cache
from typing import Annotated, Any, Literal, NamedTuple, Union, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from queue_processor.events import (
    AsgLaunchLifecycleEvent,
    AsgLifecycleEvent,
    AsgTerminateLifecycleEvent,
    CapacityReservationInterruptionEvent,
    Event,
    RebalanceRecommendationEvent,
    ScheduledChangeEvent,
    SpotInterruptionEvent,
    SqsMessageRef,
    StateChangeEvent,
)
from queue_processor.outcomes import PoisonClass, SkipClass

#: The largest SQS message body: 1 MiB ("Amazon SQS message quotas", SQS Developer Guide).
MAX_MESSAGE_BYTES = 1_048_576


class ParseResult(NamedTuple):
    """One body's result: ``"events"``, ``"skip"`` (not acted on) or ``"poison"`` (to the redrive policy), a ``reason``;
    ``envelope``: ``"eventbridge"``, ``"asg-direct"``, ``"sns"``, ``"sns+<inner>"`` or ``None``; ``reason_class``: the
    :class:`PoisonClass` of every poison result, the :class:`SkipClass` of every skip."""

    outcome: Literal["events", "skip", "poison"]
    events: tuple[Event, ...] = ()
    reason: str | None = None
    envelope: str | None = None
    reason_class: PoisonClass | SkipClass | None = None

    @classmethod
    def of_events(cls, events: tuple[Event, ...], envelope: str = "eventbridge") -> ParseResult:
        return cls("events", events, None, envelope)

    @classmethod
    def skip(cls, reason_class: SkipClass, reason: str, envelope: str | None = "eventbridge") -> ParseResult:
        return cls("skip", (), reason, envelope, reason_class)

    @classmethod
    def poison(cls, reason_class: PoisonClass, reason: str, envelope: str | None = None) -> ParseResult:
        return cls("poison", (), reason, envelope, reason_class)

    @classmethod
    def invalid(
        cls, exc: ValidationError, envelope: str | None = None, *, skip_loc: int = 0, direct: bool = False
    ) -> ParseResult:
        """Poison for a ``ValidationError``: ``missing-field`` (its first error's) or ``invalid-field``, the reason
        ``"<path>: <message>"`` of its first error with the count of the others; ``skip_loc``: leading path items
        left out (a union's tag); ``direct``: named by the keys of a notification straight to SQS."""
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        first = errors[0]
        parts = first["loc"][skip_loc:]
        if direct:
            parts = tuple(
                _DIRECT_KEYS.get(str(p), p) for p in (parts[1:] if parts[:1] == ("detail",) else parts)
            )
        loc = ".".join(str(part) for part in parts)
        reason = f"{loc}: {first['msg']}" if loc else str(first["msg"])
        if len(errors) > 1:
            reason += f" (and {len(errors) - 1} more)"
        kind = PoisonClass.MISSING_FIELD if first["type"] == "missing" else PoisonClass.INVALID_FIELD
        return cls.poison(kind, reason, envelope)


#: EventBridge envelope field → the direct Auto Scaling notification's key for the same value.
_DIRECT_KEYS = {"time": "Time", "id": "RequestId"}


def _first_error(exc: ValidationError) -> Any:
    return exc.errors(include_url=False, include_input=False, include_context=False)[0]


def _unreadable(first: Any) -> ParseResult | None:
    """Poison when a body's first validation error says it is not JSON or not an object, else ``None``."""
    if first["type"] == "json_invalid":
        return ParseResult.poison(
            PoisonClass.NOT_JSON, f"not JSON: {first['msg'].removeprefix('Invalid JSON: ')}"
        )
    if first["type"] in ("dict_type", "model_type") and not first["loc"]:
        return ParseResult.poison(PoisonClass.NOT_OBJECT, "not a JSON object")
    return None


class AffectedEntity(BaseModel):
    """One ``affectedEntities`` item; ``entityValue`` is the instance ID for EC2 events."""

    entity_value: str | None = Field(default=None, alias="entityValue")


class HealthDetail(BaseModel):
    """The ``detail`` of an AWS Health event (the fields used here)."""

    service: str | None = None
    event_type_category: str | None = Field(default=None, alias="eventTypeCategory")
    event_type_code: str | None = Field(default=None, alias="eventTypeCode")
    event_arn: str | None = Field(default=None, alias="eventArn")
    status_code: str | None = Field(default=None, alias="statusCode")
    start_time: str | None = Field(default=None, alias="startTime")
    end_time: str | None = Field(default=None, alias="endTime")
    affected_entities: list[AffectedEntity] | None = Field(default=None, alias="affectedEntities")


class HealthMessage(BaseModel):
    """An AWS Health event in its EventBridge envelope ("Amazon EventBridge events")."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    id: str | None = None
    detail_type: Literal["AWS Health Event"] = Field(alias="detail-type")
    source: str
    time: AwareDatetime | None = None
    resources: list[str] | None = None
    detail: HealthDetail


@lru_cache(maxsize=256)
def parse_health_time(value: str) -> datetime:
    """An AWS Health time, RFC 1123 or ISO 8601, as an aware datetime; ``ValueError`` when it is neither."""
    text = value.strip()
    if text[:1].isdigit():
        parsed = datetime.fromisoformat(text)
    else:
        try:
            parsed = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{value!r} is neither RFC 1123 nor ISO 8601") from exc
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _affected_instances(msg: HealthMessage) -> list[str]:
    entities = msg.detail.affected_entities
    values = (
        [entity.entity_value for entity in entities] if entities is not None else list(msg.resources or ())
    )
    # An instance ARN (arn:aws:ec2:region:account:instance/i-…) names the instance after "instance/".
    stripped = (value.strip() for value in values if value and value.strip())
    return list(dict.fromkeys(value.split(":instance/", 1)[-1] for value in stripped))


def finish_health(msg: HealthMessage) -> ParseResult:
    """One :class:`ScheduledChangeEvent` per affected instance of an open EC2 ``scheduledChange``, else a skip;
    poison without a readable ``time`` / ``startTime`` or an affected instance."""
    health = msg.detail
    for field, value, acted_on in (
        ("for service", health.service, "EC2"),
        ("category", health.event_type_category, "scheduledChange"),
    ):
        if value != acted_on:
            reason = f"AWS Health event {field} {value!r} is not acted on"
            return ParseResult.skip(SkipClass.UNHANDLED_HEALTH_EVENT, reason)
    if health.status_code == "closed":
        return ParseResult.skip(SkipClass.HEALTH_EVENT_CLOSED, "AWS Health event is closed")
    if health.start_time is None:
        return ParseResult.poison(
            PoisonClass.MISSING_FIELD, "detail.startTime: Field required", "eventbridge"
        )
    if msg.time is None:
        return ParseResult.poison(PoisonClass.MISSING_FIELD, "time: Field required", "eventbridge")
    try:
        start_time = parse_health_time(health.start_time)
    except ValueError as exc:
        return ParseResult.poison(PoisonClass.INVALID_FIELD, f"detail.startTime: {exc}", "eventbridge")
    try:
        end_time = parse_health_time(health.end_time) if health.end_time else None
    except ValueError as exc:
        return ParseResult.poison(PoisonClass.INVALID_FIELD, f"detail.endTime: {exc}", "eventbridge")
    instances = _affected_instances(msg)
    if not instances:
        reason = "detail.affectedEntities: no affected instance"
        return ParseResult.poison(PoisonClass.MISSING_FIELD, reason, "eventbridge")
    events: tuple[ScheduledChangeEvent, ...] = tuple(
        ScheduledChangeEvent(
            instance_id=instance_id,
            time=msg.time,
            scheduled_start_time=start_time,
            source_id=health.event_arn or msg.id,
            event_arn=health.event_arn,
            event_type_code=health.event_type_code,
            end_time=end_time,
            eventbridge_id=msg.id,
        )
        for instance_id in instances
    )
    return ParseResult.of_events(events)


#: Instance states after which the node will not come back as it was.
DRAIN_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


TEST_NOTIFICATION = "autoscaling:TEST_NOTIFICATION"

#: The lifecycle transitions acted on, and the event model of each.
TRANSITION_EVENTS: dict[str, type[AsgTerminateLifecycleEvent] | type[AsgLaunchLifecycleEvent]] = {
    "autoscaling:EC2_INSTANCE_TERMINATING": AsgTerminateLifecycleEvent,
    "autoscaling:EC2_INSTANCE_LAUNCHING": AsgLaunchLifecycleEvent,
}


class LifecycleProbe(BaseModel):
    """A lenient view of an Auto Scaling notification, read only to explain one that is not an action."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    event: str | None = Field(default=None, alias="Event")
    lifecycle_transition: str | None = Field(default=None, alias="LifecycleTransition")
    lifecycle_hook_name: str | None = Field(default=None, alias="LifecycleHookName")

    def not_an_action(self, envelope: str) -> ParseResult | None:
        """A skip when this notification is not a lifecycle action the controller acts on, else ``None``."""
        transition = self.lifecycle_transition
        if TEST_NOTIFICATION in (self.event, transition):  # sent when a hook is created
            return ParseResult.skip(SkipClass.TEST_NOTIFICATION, "Auto Scaling test notification", envelope)
        if transition is None:
            reason = f"Auto Scaling notification {self.event!r} is not acted on"
            return ParseResult.skip(SkipClass.UNHANDLED_KIND, reason, envelope)
        if transition not in TRANSITION_EVENTS:
            reason = f"lifecycle transition {transition!r} is not acted on"
            return ParseResult.skip(SkipClass.UNHANDLED_TRANSITION, reason, envelope)
        return None


class _EventBridgeProbe(BaseModel):
    detail: LifecycleProbe | None = None


#: EventBridge ``(source, detail-type)`` → the model of the kind acted on, told apart by its ``detail_type`` Literal.
REGISTRY: dict[tuple[str, str], type[BaseModel]] = {
    (source, detail_type): model
    for source, model in (
        ("aws.ec2", SpotInterruptionEvent),
        ("aws.ec2", RebalanceRecommendationEvent),
        ("aws.ec2", CapacityReservationInterruptionEvent),
        ("aws.ec2", StateChangeEvent),
        ("aws.health", HealthMessage),
        ("aws.autoscaling", AsgTerminateLifecycleEvent),
        ("aws.autoscaling", AsgLaunchLifecycleEvent),
    )
    for detail_type in get_args(model.model_fields["detail_type"].annotation)
}


def parse_direct(body: str | bytes) -> ParseResult:
    """An Auto Scaling notification sent straight to SQS: one event, a skip (not an action), or poison."""
    try:
        probe = LifecycleProbe.model_validate_json(body)
    except ValidationError as exc:
        return ParseResult.invalid(exc, "asg-direct")
    skipped = probe.not_an_action("asg-direct")
    if skipped is not None:
        return skipped
    try:
        event = TRANSITION_EVENTS[str(probe.lifecycle_transition)].model_validate_json(body)
    except ValidationError as exc:
        return ParseResult.invalid(exc, "asg-direct", direct=True)
    return ParseResult.of_events((event,), "asg-direct")


class OtherMessage(LifecycleProbe):
    """The top level of a body that is not a registered EventBridge kind."""

    detail_type: str | None = Field(default=None, alias="detail-type")
    source: str | None = None
    sns_type: str | None = Field(default=None, alias="Type")
    sns_message: str | None = Field(default=None, alias="Message")


@cache
def _kinds() -> TypeAdapter[Any]:
    """Every registered model as one union tagged by ``detail-type``, built once."""
    models = tuple(dict.fromkeys(REGISTRY.values()))
    union: Any = Union[models]  # noqa: UP007 - a runtime tuple of types needs the subscript form
    # cache_strings=False: a message's values (IDs, tokens, times) are unique, so the cache only costs.
    return TypeAdapter(
        Annotated[union, Field(discriminator="detail_type")], config=ConfigDict(cache_strings=False)
    )


def parse(body: str | bytes, message: SqsMessageRef | None = None) -> ParseResult:
    """The :class:`ParseResult` of one SQS message body (str or UTF-8), ``message`` on each event; never raises."""
    try:
        result = _parse(body, wrapped=False)
    except Exception as exc:  # parse is total: a bug in a kind parser must not kill the receive loop
        return ParseResult.poison(PoisonClass.OTHER, f"unexpected {type(exc).__name__} while parsing: {exc}")
    for event in result.events:
        if message is not None:
            event.attach(message)
        # A start time past year 9999 is poison now, not an OverflowError mid-drain; only year 9999 can overflow.
        if event.time.year < 9999:
            continue
        try:
            event.start_time  # noqa: B018 - computed and cached for its check
        except (OverflowError, ValueError) as exc:
            return ParseResult.poison(
                PoisonClass.INVALID_FIELD, f"time: start time out of range ({exc})", result.envelope
            )
    return result


def _parse(body: str | bytes, *, wrapped: bool) -> ParseResult:
    if len(body) * 4 > MAX_MESSAGE_BYTES:  # a UTF-8 character is at most 4 bytes
        if isinstance(body, str) and len(body) > MAX_MESSAGE_BYTES:  # too large whatever its encoding
            reason = f"larger than SQS allows: more than {MAX_MESSAGE_BYTES} bytes"
            return ParseResult.poison(PoisonClass.TOO_LARGE, reason)
        size = len(body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body)
        if size > MAX_MESSAGE_BYTES:
            reason = f"larger than SQS allows: {size} bytes > {MAX_MESSAGE_BYTES}"
            return ParseResult.poison(PoisonClass.TOO_LARGE, reason)
    # A hint, not a decision: what the EventBridge kinds do not take goes through the other shapes.
    text = body if isinstance(body, str) else body.decode("utf-8", "replace")
    hinted = '"detail-type"' in text
    result = _eventbridge(body) if hinted else None
    if result is None:
        result = _other(body, wrapped=wrapped, tried_eventbridge=hinted)
    if wrapped:
        return result._replace(envelope="sns" if result.envelope is None else f"sns+{result.envelope}")
    return result


def _eventbridge(body: str | bytes) -> ParseResult | None:
    """A registered EventBridge kind, validated into its model; ``None`` when the body is not one."""
    try:
        validated = _kinds().validator.validate_json(body)
    except ValidationError as exc:
        first = _first_error(exc)
        unreadable = _unreadable(first)
        if unreadable is not None or first["type"] in ("union_tag_not_found", "union_tag_invalid"):
            return unreadable  # or None: not one of the registered kinds
        # A registered kind (the first location item is its detail-type) that lacks what it needs; a terminate
        # action under the launch detail-type (or the reverse) fails its Literal: poison, naming both.
        model = next(model for (_, detail_type), model in REGISTRY.items() if detail_type == first["loc"][0])
        if issubclass(model, AsgLifecycleEvent):  # skipped when it is no action
            try:
                probe = _EventBridgeProbe.model_validate_json(body).detail
            except ValidationError:
                probe = None
            skipped = probe.not_an_action("eventbridge") if probe is not None else None
            if skipped is not None:
                return skipped
        return ParseResult.invalid(exc, "eventbridge", skip_loc=1)
    if (validated.source, validated.detail_type) not in REGISTRY:
        return _not_acted_on(validated.source, validated.detail_type)
    if isinstance(validated, HealthMessage):
        return finish_health(validated)
    if isinstance(validated, StateChangeEvent) and validated.state not in DRAIN_STATES:
        return ParseResult.skip(
            SkipClass.UNHANDLED_STATE, f"instance state {validated.state!r} is not acted on"
        )
    return ParseResult.of_events((validated,))


def _not_acted_on(source: str | None, detail_type: str | None) -> ParseResult:
    """An EventBridge event of no registered kind: a skip, or poison without its ``source`` or ``detail-type``."""
    for name, value in (("source", source), ("detail-type", detail_type)):
        if value is None:
            return ParseResult.poison(PoisonClass.MISSING_FIELD, f"{name}: Field required", "eventbridge")
    return ParseResult.skip(
        SkipClass.UNHANDLED_KIND, f"EventBridge event {source!r} / {detail_type!r} is not acted on"
    )


def _other(body: str | bytes, *, wrapped: bool, tried_eventbridge: bool) -> ParseResult:
    """SNS, a direct Auto Scaling notification, an EventBridge event of another kind, or poison."""
    try:
        raw = OtherMessage.model_validate_json(body)
    except ValidationError as exc:
        return _unreadable(_first_error(exc)) or ParseResult.invalid(exc)
    if raw.source is not None or raw.detail_type is not None:
        if not tried_eventbridge:  # the hint missed it (an escaped key): go the EventBridge way
            result = _eventbridge(body)
            if result is not None:
                return result
        return _not_acted_on(raw.source, raw.detail_type)
    if raw.sns_type is not None:
        if wrapped:  # the caller adds "sns"
            return ParseResult.poison(PoisonClass.UNKNOWN_SHAPE, "an SNS envelope inside an SNS envelope")
        if raw.sns_type != "Notification":
            return ParseResult.skip(
                SkipClass.SNS_CONTROL, f"SNS {raw.sns_type} message is not acted on", "sns"
            )
        if raw.sns_message is None:
            return ParseResult.poison(PoisonClass.MISSING_FIELD, "Message: Field required", "sns")
        return _parse(raw.sns_message, wrapped=True)
    # An Auto Scaling notification sent straight to SQS.
    direct = raw.lifecycle_transition is not None or raw.lifecycle_hook_name is not None
    if direct or (raw.event or "").startswith("autoscaling:"):
        return parse_direct(body)
    return ParseResult.poison(
        PoisonClass.UNKNOWN_SHAPE,
        "not a known message shape: neither an EventBridge event, an Auto Scaling notification "
        "nor an SNS notification",
    )
