"""What the pipeline reports: one interface, :class:`Observer`, and its vocabularies.

Every component that has something to count (consumer, handler, heartbeats, drainer, the Kubernetes and AWS
clients) takes one ``observer`` and calls its methods where a decision is made, with a value of an enum
chosen there; none of them knows Prometheus. :class:`~queue_processor.observe.metrics.Metrics` is the
implementation the controller runs with; :data:`NULL_OBSERVER` (every method does nothing) is the default,
so tests and tools build components without metrics.

The label vocabularies are the enums of :mod:`queue_processor.outcomes` (the leaf every layer may import),
each decided where it happens: :class:`~queue_processor.outcomes.PoisonClass` and
:class:`~queue_processor.outcomes.SkipClass` (parser), :class:`~queue_processor.outcomes.DrainOutcome` and
:class:`~queue_processor.outcomes.EvictionOutcome` (drainer), and the pipeline's own
(:class:`~queue_processor.outcomes.NodeAction`, :class:`~queue_processor.outcomes.ErrorWhere`...). Their values
are the label values metrics expose; dashboards depend on them.
"""

from __future__ import annotations

from typing import Literal, Protocol

from queue_processor.outcomes import (
    AwsResult,
    DrainEnd,
    DrainOutcome,
    ErrorWhere,
    EvictionOutcome,
    HeartbeatResult,
    LifecycleResult,
    MessageFate,
    NodeAction,
    OperationOutcome,
    PoisonClass,
    SkipClass,
    SurgeResult,
)

__all__ = [
    "NULL_OBSERVER",
    "NullObserver",
    "Observer",
]


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

    def drains_waiting(self, group: str, drains: int) -> None:
        """Drains of ``group`` waiting for a turn now (DRAIN_BUDGET_NON_URGENT)."""
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

    def surge(self, result: SurgeResult) -> None:
        """A pod annotated ``queue-processor/drain: surge`` got its replacement first, or why not
        (SURGE_DRAINS)."""
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
