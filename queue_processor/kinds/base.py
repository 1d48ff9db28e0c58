"""What every message-kind module shares: the parse result, the EventBridge envelope, the registry of kinds
(:func:`register`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from queue_processor.events import BaseEvent, SqsMessageRef
from queue_processor.outcomes import PoisonClass, SkipClass

#: The event type a :class:`ParseResult` carries: one kind's, or :data:`queue_processor.kinds.Event`.
E = TypeVar("E", bound=BaseEvent, covariant=True)
K = TypeVar("K", bound=BaseEvent)

Outcome = Literal["events", "skip", "poison"]


class ParseResult(NamedTuple, Generic[E]):
    """What the parser made of one body: ``"events"``, ``"skip"`` (valid, not acted on) or ``"poison"`` (left to
    the redrive policy) with a ``reason``. ``envelope``: ``"eventbridge"``, ``"asg-direct"``, ``"sns"``,
    ``"sns+<inner>"`` or ``None``."""

    outcome: Outcome
    events: tuple[E, ...] = ()
    reason: str | None = None
    envelope: str | None = None
    reason_class: PoisonClass | SkipClass | None = None

    @property
    def poison_class(self) -> PoisonClass:
        """The :class:`PoisonClass` of a poison result (``other`` for any other result)."""
        return self.reason_class if isinstance(self.reason_class, PoisonClass) else PoisonClass.OTHER

    @property
    def skip_class(self) -> SkipClass | None:
        """The :class:`SkipClass` of a skip result, else ``None``."""
        return self.reason_class if isinstance(self.reason_class, SkipClass) else None

    @classmethod
    def of_events(cls, events: tuple[E, ...], envelope: str = "eventbridge") -> ParseResult[E]:
        """An ``events`` result; ``events`` must not be empty."""
        return cls("events", events, None, envelope)

    @classmethod
    def skip(
        cls, reason_class: SkipClass, reason: str, envelope: str | None = "eventbridge"
    ) -> ParseResult[Any]:
        """A ``skip`` result: its class and its free-text reason."""
        return cls("skip", (), reason, envelope, reason_class)

    @classmethod
    def poison(cls, reason_class: PoisonClass, reason: str, envelope: str | None = None) -> ParseResult[Any]:
        """A ``poison`` result: its class and its free-text reason."""
        return cls("poison", (), reason, envelope, reason_class)

    @classmethod
    def invalid(cls, exc: ValidationError, reason: str, envelope: str | None = None) -> ParseResult[Any]:
        """A ``poison`` result for a ``ValidationError`` of a known shape (:func:`validation_class`)."""
        return cls.poison(validation_class(exc), reason, envelope)


class Poison(Exception):  # noqa: N818 - it names the outcome, not an error of ours
    """Raised by a kind parser when a message lacks a field it needs or holds one it cannot read."""

    def __init__(self, reason_class: PoisonClass, reason: str) -> None:
        super().__init__(reason)
        self.reason_class = reason_class
        self.reason = reason


class EventBridgeMessage(BaseModel):
    """The EventBridge envelope ("Amazon EventBridge events"), for a kind whose message is not its event."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    id: str | None = None
    detail_type: str = Field(alias="detail-type")
    source: str
    time: AwareDatetime | None = None
    detail: Any = None


M = TypeVar("M", bound=BaseModel)
KindParser = Callable[[Any, SqsMessageRef | None], ParseResult[Any]]
InvalidHook = Callable[[str | bytes], ParseResult[Any] | None]


@dataclass(frozen=True, slots=True)
class KindSpec:
    """A registered EventBridge kind; ``on_invalid`` may explain (as a skip) a body that failed validation."""

    source: str
    detail_types: tuple[str, ...]
    model: type[BaseModel]
    finish: KindParser
    on_invalid: InvalidHook | None = None


#: EventBridge ``(source, detail-type)`` → its kind. Filled by the kind modules when they are imported.
REGISTRY: dict[tuple[str, str], KindSpec] = {}
#: The same kinds by model, for the parser's hot path.
BY_MODEL: dict[type[BaseModel], KindSpec] = {}


def register(
    source: str, model: type[M], on_invalid: InvalidHook | None = None
) -> Callable[
    [Callable[[M, SqsMessageRef | None], ParseResult[Any]]],
    Callable[[M, SqsMessageRef | None], ParseResult[Any]],
]:
    """Register the decorated function as what finishes a body of ``source`` validated into ``model``, by the
    detail-types of ``model.detail_type``'s ``Literal``. Raises ``ValueError`` when that is not a ``Literal``
    of strings or a detail-type is registered already (kinds are told apart by detail-type alone)."""
    values = get_args(model.model_fields["detail_type"].annotation)
    if not values or not all(isinstance(value, str) for value in values):
        raise ValueError(f"{model.__name__}.detail_type must be a Literal of detail-types")
    detail_types: tuple[str, ...] = values
    for detail_type in detail_types:
        if any(detail_type in spec.detail_types for spec in REGISTRY.values()):
            raise ValueError(f"detail-type {detail_type!r} is registered twice")

    def decorate(
        fn: Callable[[M, SqsMessageRef | None], ParseResult[Any]],
    ) -> Callable[[M, SqsMessageRef | None], ParseResult[Any]]:
        spec = KindSpec(source, detail_types, model, fn, on_invalid)
        for detail_type in detail_types:
            REGISTRY[(source, detail_type)] = spec
        BY_MODEL[model] = spec
        return fn

    return decorate


def describe_validation_error(exc: ValidationError, skip_loc: int = 0) -> str:
    """``"<path>: <message>"`` of a ``ValidationError``'s first error, with the count of the others;
    ``skip_loc`` leading path items are left out (a tagged union's tag)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"][skip_loc:])
    line = f"{loc}: {first['msg']}" if loc else str(first["msg"])
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more)"
    return line


def validation_class(exc: ValidationError) -> PoisonClass:
    """``missing-field`` when a ``ValidationError``'s first error is a missing field, else ``invalid-field``."""
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    return PoisonClass.MISSING_FIELD if first["type"] == "missing" else PoisonClass.INVALID_FIELD


def single(event: K, message: SqsMessageRef | None) -> ParseResult[K]:
    """The finish of a kind whose model is its event: the event, as it is."""
    return ParseResult.of_events((event,))
