"""What the pipeline reports: one interface, :class:`Observer`, and its vocabularies.

Every component that has something to count (consumer, handler, heartbeats, drainer, the Kubernetes and AWS
clients) takes one ``observer`` and calls its methods where a decision is made, with a value of an enum
chosen there; none of them knows Prometheus. :class:`~queue_processor.observe.metrics.Metrics` is the
implementation the controller runs with; :data:`NULL_OBSERVER` (every method does nothing) is the default,
so tests and tools build components without metrics.

The label vocabularies are the enums below and those decided in their own modules:
:class:`~queue_processor.kinds.base.PoisonClass` and :class:`~queue_processor.kinds.base.SkipClass` (parser),
:class:`~queue_processor.drain.drainer.DrainOutcome` and :class:`~queue_processor.drain.drainer.EvictionOutcome`
(drainer). Their values are the label values metrics expose; dashboards depend on them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from queue_processor.drain.drainer import DrainOutcome, EvictionOutcome
    from queue_processor.kinds.base import PoisonClass, SkipClass

__all__ = [
    "NTH_NODE_ACTIONS",
    "NULL_OBSERVER",
    "SQS_MONITOR",
    "AwsResult",
    "DrainEnd",
    "ErrorWhere",
    "HeartbeatResult",
    "LifecycleResult",
    "MessageFate",
    "NodeAction",
    "NullObserver",
    "Observer",
    "OperationOutcome",
]


class NodeAction(StrEnum):
    """``node_action``: what was done to a node. The four of :data:`NTH_NODE_ACTIONS` count in NTH's
    ``actions_total`` exactly where NTH v1.25.6 counts them in queue-processor mode
    (``pkg/interruptionevent/draincordon/handler.go``, ``internal/common/handler.go``); the others, ours, in
    ``queue_processor_node_actions_total``."""

    PRE_DRAIN = "pre-drain"
    """PreDrain ran for an operation whose kinds have one in NTH (Spot interruption, rebalance
    recommendation, terminate lifecycle action, scheduled change; not a state change or a launch), counted
    with the cordon that carries its taints and labels; always ``success`` (NTH's PreDrain never fails in
    queue-processor mode)."""
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
    """``where`` of ``queue_processor_errors_total``: the step that failed. ``RECEIVE`` and ``BATCH`` also
    count in NTH's ``events_error_total{event_error_where="SQS_MONITOR"}``, where NTH counts its monitor's
    errors: a failed ReceiveMessage, or a batch none of whose messages could be processed."""

    RECEIVE = "receive"
    BATCH = "batch"
    """A non-empty batch none of whose messages could be processed (poison, or handling raised)."""
    PARSE = "parse"
    HANDLE = "handle"
    DELETE = "delete"
    REQUEUE = "requeue"
    VISIBILITY = "visibility"


class MessageFate(StrEnum):
    """What became of a message that carried events: the ``queue_processor_messages_*_total`` it counts
    in."""

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
    """``outcome`` of ``queue_processor_operation_outcomes_total``: an operation that ended without a drain,
    by why. All but the Lease ones are terminal (the messages are acknowledged); the Lease ones are
    requeued."""

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


class Observer(Protocol):
    """What the pipeline reports. Every method returns at once and never raises; ``queue`` is a queue URL
    as configured, ``kind`` an event kind (or ``skip`` / ``poison``, or several kinds joined by commas),
    durations are seconds. Each method's body is the no-op default a subclass inherits (:class:`NullObserver`
    overrides none)."""

    def message(self, queue: str, fate: MessageFate, kind: str) -> None:
        """A message was received, deleted or requeued."""
        return

    def poison(self, queue: str, reason_class: PoisonClass) -> None:
        """A poison message was left to the redrive policy."""
        return

    def skipped(self, queue: str, reason_class: SkipClass) -> None:
        """A valid message that is not acted on was deleted."""
        return

    def receive_answered(self, queue: str) -> None:
        """SQS answered a ReceiveMessage call on ``queue`` (with messages or none)."""
        return

    def error(self, where: ErrorWhere) -> None:
        """A step failed (``queue_processor_errors_total``; NTH's ``events_error_total`` for the monitor's)."""
        return

    def in_flight(self, messages: int, operations: int) -> None:
        """Messages held and operations under way, now."""
        return

    def draining(self, nodes: int) -> None:
        """Nodes being drained, now (bounded by DRAIN_BUDGET)."""
        return

    def node_action(self, action: NodeAction, ok: bool) -> None:
        """An action on a node succeeded (``ok``) or failed (NTH's ``actions_total`` for
        :data:`NTH_NODE_ACTIONS`, else ``queue_processor_node_actions_total``)."""
        return

    def operation_outcome(self, outcome: OperationOutcome) -> None:
        """An operation ended without a drain."""
        return

    def cordoned(self, seconds: float) -> None:
        """A node was cordoned ``seconds`` after its operation's first message was received."""
        return

    def drained(self, kind: str, result: DrainOutcome | DrainEnd, seconds: float) -> None:
        """A node's drain of the given event kind ended with ``result`` after ``seconds``."""
        return

    def eviction(self, result: EvictionOutcome) -> None:
        """One pod's eviction ended with ``result``."""
        return

    def drain_blocked(self, budget: str, pods: int) -> None:
        """PodDisruptionBudget ``budget`` (``namespace/name``) now refuses the eviction of ``pods`` pods (0:
        none any more), across every drain."""
        return

    def pod_drained(self, grace: Literal["own", "cut", "outlasted"]) -> None:
        """How an evicted pod's grace period went: all of its own (``own``), cut to end before the instance
        (``cut``), or its own, ending after the instance's end (``outlasted``: killed mid-grace)."""
        return

    def deleted_at_deadline(self) -> None:
        """A pod still on a node at its instance's end was deleted (DELETE_AT_DEADLINE)."""
        return

    def heartbeat(self, result: HeartbeatResult) -> None:
        """A heartbeat was sent (or, ``hook-unreadable``, cannot be)."""
        return

    def lifecycle_completion(self, result: LifecycleResult) -> None:
        """A CompleteLifecycleAction call ended with ``result``."""
        return

    def kube_request(self, verb: str, resource: str, status: int | None) -> None:
        """A Kubernetes API request: ``verb`` as in audit logs, ``resource`` the plural (``pods/eviction``),
        ``status`` the HTTP status, ``None`` when no response came."""
        return

    def aws_request(self, service: str, operation: str, result: AwsResult) -> None:
        """An AWS API request: ``service`` as botocore names it (``sqs``), ``operation`` as the API does
        (``ReceiveMessage``)."""
        return


class NullObserver(Observer):
    """An :class:`Observer` that reports nowhere (the default of every component)."""


#: The observer of components built without one.
NULL_OBSERVER: Observer = NullObserver()
