"""Message body → typed events: ``parse(body) -> ParseResult[Event]``, pure and total. Accepted: an EventBridge
event (:data:`queue_processor.kinds.REGISTRY`), an Auto Scaling notification sent straight to SQS, or either in
an SNS envelope ("Amazon SNS message and JSON formats"); validated straight from JSON in one pass.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Union

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from queue_processor.events import SqsMessageRef
from queue_processor.kinds import REGISTRY, Event, ParseResult, Poison
from queue_processor.kinds.asg_lifecycle import LifecycleProbe, parse_direct
from queue_processor.kinds.base import BY_MODEL, describe_validation_error
from queue_processor.outcomes import PoisonClass, SkipClass

__all__ = ["MAX_MESSAGE_BYTES", "ParseResult", "parse"]

#: The largest SQS message body: 1 MiB ("Amazon SQS message quotas", SQS Developer Guide).
MAX_MESSAGE_BYTES = 1_048_576

#: Errors of the tagged union that mean "not one of the registered EventBridge kinds".
_NOT_A_KIND = frozenset({"union_tag_not_found", "union_tag_invalid"})


class OtherMessage(LifecycleProbe):
    """The top level of a body that is not a registered EventBridge kind."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    detail_type: str | None = Field(default=None, alias="detail-type")
    source: str | None = None
    sns_type: str | None = Field(default=None, alias="Type")
    sns_message: str | None = Field(default=None, alias="Message")


@cache
def _kinds() -> TypeAdapter[Any]:
    """Every registered model as one union tagged by ``detail-type``, built once."""
    models = tuple(dict.fromkeys(spec.model for spec in REGISTRY.values()))
    union: Any = Union[models]  # noqa: UP007 - a runtime tuple of types needs the subscript form
    # cache_strings=False: a message's values (IDs, tokens, times) are unique, so the cache only costs.
    return TypeAdapter(
        Annotated[union, Field(discriminator="detail_type")], config=ConfigDict(cache_strings=False)
    )


def parse(body: str | bytes, message: SqsMessageRef | None = None) -> ParseResult[Event]:
    """The :class:`ParseResult` of one SQS message body (text or UTF-8 bytes); never raises. ``message``, when
    given, is attached to every event."""
    try:
        result = _parse(body, message, wrapped=False)
    except Exception as exc:  # parse is total: a bug in a kind parser must not kill the receive loop
        return ParseResult.poison(PoisonClass.OTHER, f"unexpected {type(exc).__name__} while parsing: {exc}")
    for event in result.events:
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


def _size_reason(body: str | bytes) -> str | None:
    length = len(body)
    if isinstance(body, str):
        if length > MAX_MESSAGE_BYTES:
            return f"larger than SQS allows: more than {MAX_MESSAGE_BYTES} bytes"
        length = len(body.encode("utf-8", "surrogatepass"))
    if length > MAX_MESSAGE_BYTES:
        return f"larger than SQS allows: {length} bytes > {MAX_MESSAGE_BYTES}"
    return None


def _parse(body: str | bytes, message: SqsMessageRef | None, *, wrapped: bool) -> ParseResult[Event]:
    if len(body) * 4 > MAX_MESSAGE_BYTES:  # a UTF-8 character is at most 4 bytes
        too_large = _size_reason(body)
        if too_large is not None:
            return ParseResult.poison(PoisonClass.TOO_LARGE, too_large)
    # Hints, not decisions: what the likely shape does not take goes through the others.
    result: ParseResult[Event] | None = None
    text = body if isinstance(body, str) else body.decode("utf-8", "replace")
    hinted = '"detail-type"' in text
    if hinted:
        result = _eventbridge(body, message)
    elif '"LifecycleTransition"' in text:
        result = parse_direct(body, message)
    if result is None:
        result = _other(body, message, wrapped=wrapped, tried_eventbridge=hinted)
    if wrapped:
        return result._replace(envelope="sns" if result.envelope is None else f"sns+{result.envelope}")
    return result


def _eventbridge(body: str | bytes, message: SqsMessageRef | None) -> ParseResult[Event] | None:
    """A registered EventBridge kind, validated into its model; ``None`` when the body is not one."""
    try:
        # pydantic-core's validator directly: TypeAdapter.validate_json adds a Python layer per call.
        validated = _kinds().validator.validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
        kind = first["type"]
        if kind == "json_invalid":
            return ParseResult.poison(
                PoisonClass.NOT_JSON, f"not JSON: {first['msg'].removeprefix('Invalid JSON: ')}"
            )
        if kind == "dict_type" and not first["loc"]:
            return ParseResult.poison(PoisonClass.NOT_OBJECT, "not a JSON object")
        if kind in _NOT_A_KIND:
            return None
        # A registered kind (the first location item is its detail-type) that lacks what it needs.
        spec = next(spec for (_, detail_type), spec in REGISTRY.items() if detail_type == first["loc"][0])
        explained = spec.on_invalid(body) if spec.on_invalid is not None else None
        if explained is not None:
            return explained
        return ParseResult.invalid(exc, describe_validation_error(exc, skip_loc=1), "eventbridge")
    spec = BY_MODEL[type(validated)]
    if validated.source != spec.source:
        if validated.source is None:
            return ParseResult.poison(PoisonClass.MISSING_FIELD, "source: Field required", "eventbridge")
        return ParseResult.skip(
            SkipClass.UNHANDLED_KIND,
            f"EventBridge event {validated.source!r} / {validated.detail_type!r} is not acted on",
        )
    try:
        result: ParseResult[Event] = spec.finish(validated, message)
    except Poison as poison:
        return ParseResult.poison(poison.reason_class, poison.reason, "eventbridge")
    if message is not None:
        for event in result.events:
            if event.message is None:
                event.attach(message)
    return result


def _other(
    body: str | bytes, message: SqsMessageRef | None, *, wrapped: bool, tried_eventbridge: bool
) -> ParseResult[Event]:
    """SNS, a direct Auto Scaling notification, an EventBridge event of another kind, or poison."""
    try:
        raw = OtherMessage.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
        if first["type"] == "json_invalid":
            return ParseResult.poison(
                PoisonClass.NOT_JSON, f"not JSON: {first['msg'].removeprefix('Invalid JSON: ')}"
            )
        if first["type"] == "model_type" and not first["loc"]:
            return ParseResult.poison(PoisonClass.NOT_OBJECT, "not a JSON object")
        return ParseResult.invalid(exc, describe_validation_error(exc))
    if raw.source is not None or raw.detail_type is not None:
        if not tried_eventbridge:  # the hint missed it (an escaped key): go the EventBridge way
            result = _eventbridge(body, message)
            if result is not None:
                return result
        if raw.source is None:
            return ParseResult.poison(PoisonClass.MISSING_FIELD, "source: Field required", "eventbridge")
        if raw.detail_type is None:
            return ParseResult.poison(PoisonClass.MISSING_FIELD, "detail-type: Field required", "eventbridge")
        return ParseResult.skip(
            SkipClass.UNHANDLED_KIND,
            f"EventBridge event {raw.source!r} / {raw.detail_type!r} is not acted on",
        )
    if raw.sns_type is not None:
        if wrapped:
            return ParseResult.poison(
                PoisonClass.UNKNOWN_SHAPE, "an SNS envelope inside an SNS envelope"
            )  # the caller adds "sns"
        if raw.sns_type != "Notification":
            return ParseResult.skip(
                SkipClass.SNS_CONTROL, f"SNS {raw.sns_type} message is not acted on", "sns"
            )
        if raw.sns_message is None:
            return ParseResult.poison(PoisonClass.MISSING_FIELD, "Message: Field required", "sns")
        return _parse(raw.sns_message, message, wrapped=True)
    if raw.looks_direct:
        return raw.not_an_action("asg-direct") or parse_direct(body, message)
    return ParseResult.poison(
        PoisonClass.UNKNOWN_SHAPE,
        "not a known message shape: neither an EventBridge event, an Auto Scaling notification "
        "nor an SNS notification",
    )
