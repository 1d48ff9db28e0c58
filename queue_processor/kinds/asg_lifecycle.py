"""Auto Scaling lifecycle actions (terminate and launch, warm pools included) → :class:`AsgLifecycleEvent`.

Formats ("Amazon EC2 Auto Scaling lifecycle hooks", "Use EventBridge to handle Auto Scaling events"): the
fields in EventBridge's ``detail``, or at the top level of the hook's own notification sent straight to SQS.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from queue_processor.events import ActionKey, BaseEvent, EventKind, NonEmptyStr, SqsMessageRef, detail_alias
from queue_processor.kinds.base import ParseResult, describe_validation_error, register, single
from queue_processor.outcomes import SkipClass


class AsgLifecycleEvent(BaseEvent):
    """A lifecycle action in either format; ``origin``/``destination`` as in "Lifecycle hooks for instances in a
    warm pool". The identity key is the action token: both forms of one action share an ``event_id``."""

    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE, EventKind.ASG_LAUNCH_LIFECYCLE]
    lifecycle_transition: str
    instance_id: NonEmptyStr = Field(
        validation_alias=AliasChoices(detail_alias("EC2InstanceId"), "EC2InstanceId")
    )
    time: AwareDatetime = Field(validation_alias=AliasChoices("time", "Time"))
    source_id: str | None = Field(default=None, validation_alias=AliasChoices("id", "RequestId"))
    auto_scaling_group_name: NonEmptyStr = Field(
        validation_alias=AliasChoices(detail_alias("AutoScalingGroupName"), "AutoScalingGroupName")
    )
    lifecycle_hook_name: NonEmptyStr = Field(
        validation_alias=AliasChoices(detail_alias("LifecycleHookName"), "LifecycleHookName")
    )
    lifecycle_action_token: str | None = Field(
        default=None,
        validation_alias=AliasChoices(detail_alias("LifecycleActionToken"), "LifecycleActionToken"),
    )
    origin: str | None = Field(default=None, validation_alias=AliasChoices(detail_alias("Origin"), "Origin"))
    destination: str | None = Field(
        default=None, validation_alias=AliasChoices(detail_alias("Destination"), "Destination")
    )
    notification_metadata: str | None = Field(
        default=None,
        validation_alias=AliasChoices(detail_alias("NotificationMetadata"), "NotificationMetadata"),
    )

    def _identity_key(self) -> str:
        return self.lifecycle_action_token or super()._identity_key()

    @property
    def action_key(self) -> ActionKey:
        """``(token or instance ID, group, hook)``, as ``CompleteLifecycleAction`` addresses the action."""
        return ActionKey(
            self.lifecycle_action_token or self.instance_id,
            self.auto_scaling_group_name,
            self.lifecycle_hook_name,
        )


class AsgTerminateLifecycleEvent(AsgLifecycleEvent):
    """A terminate lifecycle action: drain, then complete it. ``start_time = time`` (``Terminating:Wait`` from then)."""

    detail_type: Literal["EC2 Instance-terminate Lifecycle Action"] = Field(
        default="EC2 Instance-terminate Lifecycle Action", alias="detail-type", exclude=True, repr=False
    )

    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE] = EventKind.ASG_TERMINATE_LIFECYCLE
    lifecycle_transition: Literal["autoscaling:EC2_INSTANCE_TERMINATING"] = Field(
        validation_alias=AliasChoices(detail_alias("LifecycleTransition"), "LifecycleTransition")
    )


class AsgLaunchLifecycleEvent(AsgLifecycleEvent):
    """A launch lifecycle action, into the group or a warm pool: wait for the node, then complete it."""

    detail_type: Literal["EC2 Instance-launch Lifecycle Action"] = Field(
        default="EC2 Instance-launch Lifecycle Action", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.ASG_LAUNCH_LIFECYCLE] = EventKind.ASG_LAUNCH_LIFECYCLE
    lifecycle_transition: Literal["autoscaling:EC2_INSTANCE_LAUNCHING"] = Field(
        validation_alias=AliasChoices(detail_alias("LifecycleTransition"), "LifecycleTransition")
    )


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

    @property
    def is_test_notification(self) -> bool:
        """Whether this is the ``autoscaling:TEST_NOTIFICATION`` sent when a hook is created."""
        return TEST_NOTIFICATION in (self.event, self.lifecycle_transition)

    @property
    def looks_direct(self) -> bool:
        """Whether a top-level object read this way is an Auto Scaling notification (sent straight to SQS)."""
        if self.lifecycle_transition is not None or self.lifecycle_hook_name is not None:
            return True
        return self.event is not None and self.event.startswith("autoscaling:")

    def not_an_action(self, envelope: str) -> ParseResult[Any] | None:
        """A skip when this notification is not a lifecycle action the controller acts on, else ``None``."""
        if self.is_test_notification:
            return ParseResult.skip(SkipClass.TEST_NOTIFICATION, "Auto Scaling test notification", envelope)
        if self.lifecycle_transition is None:
            return ParseResult.skip(
                SkipClass.UNHANDLED_KIND,
                f"Auto Scaling notification {self.event!r} is not acted on",
                envelope,
            )
        if self.lifecycle_transition not in TRANSITION_EVENTS:
            return ParseResult.skip(
                SkipClass.UNHANDLED_TRANSITION,
                f"lifecycle transition {self.lifecycle_transition!r} is not acted on",
                envelope,
            )
        return None


class _EventBridgeProbe(BaseModel):
    detail: LifecycleProbe | None = None


def _explain_invalid(body: str | bytes) -> ParseResult[Any] | None:
    """A skip for a lifecycle EventBridge message that failed validation but is no action, else ``None``."""
    try:
        probe = _EventBridgeProbe.model_validate_json(body)
    except ValidationError:
        return None
    return probe.detail.not_an_action("eventbridge") if probe.detail is not None else None


# A terminate action under the launch detail-type (or the reverse) fails its Literal: poison, naming both.
finish_terminate = register("aws.autoscaling", AsgTerminateLifecycleEvent, on_invalid=_explain_invalid)(
    single
)
finish_launch = register("aws.autoscaling", AsgLaunchLifecycleEvent, on_invalid=_explain_invalid)(single)

# EventBridge envelope field → the direct notification's key for the same value.
_DIRECT_KEYS = {"time": "Time", "id": "RequestId"}


def parse_direct(
    body: str | bytes, message: SqsMessageRef | None
) -> ParseResult[AsgTerminateLifecycleEvent | AsgLaunchLifecycleEvent]:
    """An Auto Scaling notification sent straight to SQS: one event, a skip (not an action), or poison."""
    text = body if isinstance(body, str) else body.decode("utf-8", "replace")
    model = next(
        (model for transition, model in TRANSITION_EVENTS.items() if f'"{transition}"' in text), None
    )
    if model is not None:
        try:
            return _direct_event(model, body, message)
        except ValidationError as exc:
            error = exc
    try:
        probe = LifecycleProbe.model_validate_json(body)
    except ValidationError as exc:
        return ParseResult.invalid(exc, describe_validation_error(exc), "asg-direct")
    skipped = probe.not_an_action("asg-direct")
    if skipped is not None:
        return skipped
    if model is None:  # the text search missed the transition (JSON escapes in it); the probe read it
        try:
            return _direct_event(TRANSITION_EVENTS[str(probe.lifecycle_transition)], body, message)
        except ValidationError as exc:
            error = exc
    return ParseResult.invalid(error, _direct_reason(error), "asg-direct")


def _direct_event(
    model: type[AsgTerminateLifecycleEvent] | type[AsgLaunchLifecycleEvent],
    body: str | bytes,
    message: SqsMessageRef | None,
) -> ParseResult[AsgTerminateLifecycleEvent | AsgLaunchLifecycleEvent]:
    event = model.model_validate_json(body)
    if message is not None:
        event.attach(message)
    return ParseResult.of_events((event,), "asg-direct")


def _direct_reason(error: ValidationError) -> str:
    # A missing field is reported at its EventBridge alias ("detail.X", "time"): name the direct key instead.
    first = error.errors(include_url=False, include_input=False, include_context=False)[0]
    loc = first["loc"][1:] if first["loc"][:1] == ("detail",) else first["loc"]
    name = ".".join(_DIRECT_KEYS.get(str(part), str(part)) for part in loc)
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{name}: {first['msg']}{more}" if name else f"{first['msg']}{more}"
