"""The controller's errors and outcome vocabularies: the leaf every layer may import (DESIGN.md, "Layout").
The enums' values are label values of the metrics: dashboards depend on them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal


class ConfigError(ValueError):
    """A setting is missing or invalid; ``str()`` is one line naming the variable(s)."""


class StartupError(ConfigError):
    """Start-up found the environment unusable in a way waiting will not heal; one line naming the setting."""


class KubeError(Exception):
    """An error answer from the API server: ``status`` (HTTP; 0 for a connection error), the Status's ``reason``,
    ``message`` and ``details.causes``, and ``retry_after_s`` (Retry-After, seconds)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        retry_after_s: float | None = None,
        causes: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s
        self.causes = causes or []


class ClaimLost(Exception):  # noqa: N818 - it names what happened
    """The node's Lease is no longer this replica's: another replica holds it, or it lapsed (e.g. a paused process)."""


class PoisonClass(StrEnum):
    """Why a message is poison: ``reason`` of ``queue_processor_messages_poison_total``."""

    NOT_JSON = "not-json"
    """The body (or an SNS envelope's ``Message``) is not JSON, including an empty body."""
    NOT_OBJECT = "not-object"
    """JSON, but not an object: an array, a string, a number, ``null``."""
    TOO_LARGE = "too-large"
    """Larger than SQS allows (1 MiB)."""
    UNKNOWN_SHAPE = "unknown-shape"
    """Neither an EventBridge event, an Auto Scaling notification nor an SNS notification (or an SNS
    envelope inside an SNS envelope)."""
    MISSING_FIELD = "missing-field"
    """A known kind without a field it needs (an AWS Health event naming no instance included)."""
    INVALID_FIELD = "invalid-field"
    """A known kind with a field of the wrong type or value (a blank ID, an unreadable time, a start time
    out of range, a lifecycle transition under the other detail-type)."""
    OTHER = "other"
    """Anything else: a bug in a kind parser, caught so the receive loop lives on."""


class SkipClass(StrEnum):
    """Why a valid message is not acted on: ``reason_class`` of ``queue_processor_messages_skipped_total``."""

    TEST_NOTIFICATION = "test-notification"
    """``autoscaling:TEST_NOTIFICATION``, sent when a lifecycle hook is created."""
    UNHANDLED_KIND = "unhandled-kind"
    """An EventBridge ``source`` / ``detail-type``, or an Auto Scaling notification, not acted on."""
    UNHANDLED_TRANSITION = "unhandled-transition"
    """A lifecycle transition other than ``EC2_INSTANCE_TERMINATING`` / ``EC2_INSTANCE_LAUNCHING``."""
    UNHANDLED_STATE = "unhandled-state"
    """An instance state other than stopping, stopped, shutting-down or terminated."""
    UNHANDLED_HEALTH_EVENT = "unhandled-health-event"
    """An AWS Health event of another service or category than EC2 ``scheduledChange``."""
    HEALTH_EVENT_CLOSED = "health-event-closed"
    """An AWS Health event whose ``statusCode`` is ``closed``."""
    SNS_CONTROL = "sns-control"
    """An SNS message that is not a ``Notification`` (``SubscriptionConfirmation``...)."""


class DrainOutcome(StrEnum):
    """How a drain ended: ``result`` of ``queue_processor_drain_duration_seconds``."""

    DRAINED = "drained"
    """Every pod to evict is gone."""
    TIMEOUT = "timeout"
    """Pods were still there at the deadline (PodDisruptionBudgets included)."""
    ERROR = "error"
    """A pod could not be evicted: the filters refused it, or its eviction failed."""
    DELETED = "deleted"
    """Pods still there at the deadline were deleted (DELETE_AT_DEADLINE) and none is left."""


class EvictionOutcome(StrEnum):
    """How one pod's eviction ended: ``result`` of ``queue_processor_evictions_total``."""

    EVICTED = "evicted"
    """The Eviction API accepted it (201)."""
    GONE = "gone"
    """The pod was gone already (404)."""
    PDB_BLOCKED = "pdb-blocked"
    """A PodDisruptionBudget refused it (429) until the deadline."""
    ERROR = "error"
    """Another error (several budgets match the pod: 500; anything else until the deadline)."""


class SurgeResult(StrEnum):
    """``result`` of ``queue_processor_surges_total``: a ``surge`` pod's replacement came first, or why not."""

    SURGED = "surged"
    """Its Deployment was scaled one replica up and had one more available replica before the eviction."""
    NOT_READY = "not-ready"
    """The replacement was not available by the time the pod's eviction had to start: evicted (the extra
    replica stays until the pod is gone)."""
    UNDONE = "undone"
    """The Deployment's owner set its replica count again during the surge (a GitOps self-heal): its count is
    kept, and the pod evicted without a replacement."""
    NO_TIME = "no-time"
    """The drain's end left too little time to wait for a replacement: evicted at once (decided before any
    scale-up)."""
    AUTOSCALED = "autoscaled"
    """A HorizontalPodAutoscaler owns the Deployment's replica count: evicted, the count left to it."""
    UNAVAILABLE = "unavailable"
    """The Deployment could not be read or scaled (gone, not the pod's, refused, an error): evicted."""


class NodeAction(StrEnum):
    """``node_action``: what was done to a node. :data:`NTH_NODE_ACTIONS` count in NTH's ``actions_total`` where
    NTH v1.25.6 counts them (``pkg/interruptionevent/draincordon/handler.go``); ours in ``node_actions_total``."""

    PRE_DRAIN = "pre-drain"
    """PreDrain, for kinds that have one in NTH (not a state change or a launch), counted with the cordon;
    always ``success``, as in NTH."""
    CORDON = "cordon"
    """The node was cordoned with CORDON_ONLY (NTH counts ``cordon`` only then, and only a success)."""
    CORDON_AND_DRAIN = "cordon-and-drain"
    """The node was cordoned and drained (``error``: the drain did not finish; a node that is not there is
    not counted, as in NTH)."""
    POST_DRAIN = "post-drain"
    """PostDrain: the operation's lifecycle actions completed after its drain (or its cordon with
    CORDON_ONLY), and a launch action completed once its node is Ready."""
    TAINT = "taint"
    """The interruption's taint was written (TAINT_NODE)."""
    EXCLUDE_FROM_LB = "exclude-from-lb"
    """``node.kubernetes.io/exclude-from-external-load-balancers`` was added (EXCLUDE_FROM_LOAD_BALANCERS)."""
    OUT_OF_SERVICE_TAINT = "out-of-service-taint"
    """``node.kubernetes.io/out-of-service`` was added after the drain (ENABLE_OUT_OF_SERVICE_TAINT)."""
    HEARTBEAT = "heartbeat"
    """RecordLifecycleActionHeartbeat."""
    LIFECYCLE_COMPLETE = "lifecycle-complete"
    """CompleteLifecycleAction of a terminate action after the drain."""
    LAUNCH_READY = "launch-ready"
    """CompleteLifecycleAction of a launch action once its node is Ready."""
    LEAVE = "leave"
    """The controller's own pod was evicted, last, from the node it drained: its successor completes the node's
    actions."""
    UNCORDON = "uncordon"
    """Our cordon, taints and label were undone: the instance came back into service (UNCORDON_ON_RETURN)."""


#: The ``node_action`` values NTH has: counted in its ``actions_total``.
NTH_NODE_ACTIONS = frozenset(
    {NodeAction.PRE_DRAIN, NodeAction.CORDON, NodeAction.CORDON_AND_DRAIN, NodeAction.POST_DRAIN}
)


#: NTH's only ``event_error_where`` in queue-processor mode (``pkg/monitor/sqsevent``): the SQS monitor.
SQS_MONITOR = "SQS_MONITOR"


class ErrorWhere(StrEnum):
    """``where`` of ``queue_processor_errors_total``: the step that failed."""

    RECEIVE = "receive"
    BATCH = "batch"
    """A non-empty batch none of whose messages could be processed (poison, or handling raised)."""
    PARSE = "parse"
    HANDLE = "handle"
    DELETE = "delete"
    REQUEUE = "requeue"
    VISIBILITY = "visibility"
    SETTLE = "settle"
    """Settling a message (deleting or requeuing it once its operations ended) raised."""


class MessageFate(StrEnum):
    """What became of a message that carried events (``queue_processor_messages_*_total``)."""

    RECEIVED = "received"
    DELETED = "deleted"
    REQUEUED = "requeued"


class HeartbeatResult(StrEnum):
    """``result`` of ``queue_processor_heartbeats_total``."""

    OK = "ok"
    ERROR = "error"
    """A failed call (throttling, 5xx, network): the beat is retried within seconds."""
    VALIDATION_ERROR = "validation-error"
    """AWS's ``ValidationError`` (no active lifecycle action): the action is over, its heartbeat stops."""
    HOOK_UNREADABLE = "hook-unreadable"
    """No call made: DescribeLifecycleHooks was refused, so the hook's timeout is unknown (counted per
    action that gets no heartbeats)."""


class LifecycleResult(StrEnum):
    """``result`` of ``queue_processor_lifecycle_completions_total``."""

    CONTINUE = "continue"
    """``CompleteLifecycleAction`` with ``LifecycleActionResult=CONTINUE`` succeeded."""
    ABANDON = "abandon"
    """``CompleteLifecycleAction`` with ``LifecycleActionResult=ABANDON`` succeeded."""
    ERROR = "error"
    """The call failed (after its retries)."""
    NO_ACTIVE_ACTION = "no-active-action"
    """``ValidationError: No active Lifecycle Action found``: completed, abandoned or timed out already."""


class OperationOutcome(StrEnum):
    """``outcome`` of ``queue_processor_operation_outcomes_total``: why no drain (Lease ones RETRY, others DONE)."""

    UNKNOWN_INSTANCE = "unknown-instance"
    """EC2 does not know the instance (gone long ago, or another account or region)."""
    UNMANAGED = "unmanaged"
    """CHECK_TAG_BEFORE_DRAINING and the instance lacks MANAGED_TAG."""
    INSTANCE_GONE = "instance-gone"
    """The instance is terminated or shutting down and its node is gone."""
    NODE_NOT_FOUND = "node-not-found"
    """No node for the instance, and DELETE_SQS_MSG_IF_NODE_NOT_FOUND."""
    NO_NODE = "no-node"
    """No node registered for the instance in the LAUNCH_READY_TIMEOUT_SEC since it started: nothing to
    drain, its lifecycle actions completed."""
    LAUNCH_NOT_READY = "launch-not-ready"
    """A launching instance's node was not Ready LAUNCH_READY_TIMEOUT_SEC after the action began: its launch
    actions were completed with their hook's DefaultResult."""
    ACTION_OVER = "action-over"
    """Every launch action of the operation was over already (AWS said so): acknowledged."""
    STARTED_AGAIN = "started-again"
    """Only ``stopping``/``stopped`` state changes, and the instance is running again (a warm pool)."""
    LEASE_HELD = "lease-held"
    """Another replica holds the node's Lease."""
    LEASE_LOST = "lease-lost"
    """This replica lost the node's Lease during the operation (EarlyExit)."""


DrainEnd = Literal["drained", "deleted", "timeout", "error", "cancelled"]
"""``result`` of ``queue_processor_drain_duration_seconds``: a :class:`DrainOutcome` value, or
``cancelled`` when the operation was cancelled (shutdown, lost Lease) during the drain."""


AwsResult = Literal["ok", "error", "throttled"]
"""``result`` of ``queue_processor_aws_requests_total``."""
