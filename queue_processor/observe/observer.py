"""What the pipeline reports: :class:`Observer`, called where a decision is made with an enum value of
:mod:`queue_processor.outcomes`. :class:`~queue_processor.observe.metrics.Metrics` implements it for Prometheus;
:data:`NULL_OBSERVER` is the default, so tests and tools build components without metrics.
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
    """What the pipeline reports; every method returns at once, never raises, and does nothing by default. ``queue``
    is a queue URL as configured, ``kind`` an event kind (``skip``, ``poison``, or kinds joined by commas); seconds."""

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
        """An action on a node succeeded (``ok``) or failed."""
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
        """PodDisruptionBudget ``budget`` (``namespace/name``) now refuses ``pods`` evictions, across drains."""
        return

    def pod_drained(self, grace: Literal["own", "cut", "outlasted"]) -> None:
        """How an evicted pod's grace period went (see :class:`~queue_processor.observe.metrics.Metrics`)."""
        return

    def deleted_at_deadline(self) -> None:
        """A pod still on a node at its instance's end was deleted (DELETE_AT_DEADLINE)."""
        return

    def surge(self, result: SurgeResult) -> None:
        """A pod annotated ``queue-processor/drain: surge`` got its replacement first, or why not."""
        return

    def heartbeat(self, result: HeartbeatResult) -> None:
        """A heartbeat was sent (or, ``hook-unreadable``, cannot be)."""
        return

    def lifecycle_completion(self, result: LifecycleResult) -> None:
        """A CompleteLifecycleAction call ended with ``result``."""
        return

    def kube_request(self, verb: str, resource: str, status: int | None) -> None:
        """A Kubernetes API request; ``status`` is the HTTP status, ``None`` when no response came."""
        return

    def aws_request(self, service: str, operation: str, result: AwsResult) -> None:
        """An AWS API request: ``service`` as botocore names it (``sqs``), ``operation`` (``ReceiveMessage``)."""
        return


class NullObserver(Observer):
    """An :class:`Observer` that reports nowhere (the default of every component)."""


#: The observer of components built without one.
NULL_OBSERVER: Observer = NullObserver()
