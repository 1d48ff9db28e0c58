"""Auto Scaling lifecycle actions → :class:`AsgLifecycleEvent` (terminate and
launch, warm pools included).

Two formats carry the same fields ("Amazon EC2 Auto Scaling lifecycle hooks" and "Use EventBridge to handle
Auto Scaling events", EC2 Auto Scaling User Guide):

- EventBridge: source ``aws.autoscaling``, detail-type ``EC2 Instance-terminate Lifecycle Action`` or
  ``EC2 Instance-launch Lifecycle Action``, the fields below in ``detail`` and the time in the envelope;
- the hook's own notification, sent straight to an SQS (or SNS) target: the same fields at the top level plus
  ``Service``, ``Time``, ``RequestId``, ``AccountId`` and, for a test notification, ``Event``.

Fields: ``EC2InstanceId``, ``AutoScalingGroupName``, ``LifecycleHookName``, ``LifecycleActionToken``,
``LifecycleTransition``, and optionally ``Origin``/``Destination`` (``EC2``, ``AutoScalingGroup``,
``WarmPool``) and ``NotificationMetadata``. ``autoscaling:TEST_NOTIFICATION`` (sent when a hook is created)
is skipped. ``start_time = time``: the instance stays in ``Terminating:Wait`` until the action is completed or
its heartbeat timeout passes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from queue_processor.events import ActionKey, BaseEvent, EventKind, NonEmptyStr, SqsMessageRef, detail_alias
from queue_processor.kinds.base import ParseResult, describe_validation_error, register, single
from queue_processor.outcomes import SkipClass


class AsgLifecycleEvent(BaseEvent):
    """An Auto Scaling lifecycle action, read from EventBridge's ``detail`` or from the notification the hook
    sends straight to SQS (the same field names at the top level, with ``Time`` and ``RequestId``). Its two
    kinds are :class:`AsgTerminateLifecycleEvent` and :class:`AsgLaunchLifecycleEvent`.

    ``lifecycle_action_token`` and the instance ID address the action in ``CompleteLifecycleAction`` and
    ``RecordLifecycleActionHeartbeat``. ``origin``/``destination`` are ``EC2``, ``AutoScalingGroup`` or
    ``WarmPool`` ("Lifecycle hooks for instances in a warm pool", EC2 Auto Scaling User Guide);
    ``notification_metadata`` is the hook's free-form string. The identity key is the token, so the
    EventBridge and the direct form of one action share an ``event_id``.
    """

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
        """The lifecycle action's identity: ``(token or instance ID, group, hook)``, as the lifecycle API
        addresses it (the EventBridge and the direct form of one action share it)."""
        return ActionKey(
            self.lifecycle_action_token or self.instance_id,
            self.auto_scaling_group_name,
            self.lifecycle_hook_name,
        )


class AsgTerminateLifecycleEvent(AsgLifecycleEvent):
    """A terminate lifecycle action (``autoscaling:EC2_INSTANCE_TERMINATING``): drain, then complete it.
    ``start_time = time``: the instance waits in ``Terminating:Wait`` until the action is completed or its
    heartbeat timeout passes."""

    detail_type: Literal["EC2 Instance-terminate Lifecycle Action"] = Field(
        default="EC2 Instance-terminate Lifecycle Action", alias="detail-type", exclude=True, repr=False
    )
    taint_key: ClassVar[str | None] = "aws-node-termination-handler/asg-lifecycle-termination"

    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE] = EventKind.ASG_TERMINATE_LIFECYCLE
    lifecycle_transition: Literal["autoscaling:EC2_INSTANCE_TERMINATING"] = Field(
        validation_alias=AliasChoices(detail_alias("LifecycleTransition"), "LifecycleTransition")
    )


class AsgLaunchLifecycleEvent(AsgLifecycleEvent):
    """A launch lifecycle action (``autoscaling:EC2_INSTANCE_LAUNCHING``), into the group or a warm pool:
    wait for the node, then complete it. ``start_time = time``."""

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
    """A lenient view of an Auto Scaling notification, read only to explain one that is not an action:
    a test notification, a plain scaling notification (``Event`` without ``LifecycleTransition``), or a
    transition that is not acted on."""

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
    """A terminate/launch EventBridge message that did not validate as its action: a skip when its detail
    is a test notification or a transition not acted on, else ``None`` (poison)."""
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
    """An Auto Scaling notification sent straight to SQS: one event for a terminate or launch action
    (validated from JSON in one pass), a skip for a test notification, a plain scaling notification or a
    transition not acted on, poison when a field an action needs is missing or mistyped."""
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
    # A missing field is reported at its first alias, the EventBridge one ("detail.X", "time"); name the key
    # of the direct notification instead.
    first = error.errors(include_url=False, include_input=False, include_context=False)[0]
    loc = first["loc"][1:] if first["loc"][:1] == ("detail",) else first["loc"]
    name = ".".join(_DIRECT_KEYS.get(str(part), str(part)) for part in loc)
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{name}: {first['msg']}{more}" if name else f"{first['msg']}{more}"
