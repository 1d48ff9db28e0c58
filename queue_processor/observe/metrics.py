"""Prometheus metrics of the controller: :class:`Metrics`, one per process, in a registry of its own.

Names follow "Metric and label naming" (prometheus.io). ``actions_total`` and ``events_error_total`` are NTH's
(``pkg/observability/opentelemetry.go``), unprefixed so its dashboards keep working. Labels stay bounded: ``queue``
is the queue URL as configured, ``kind`` an event kind or :data:`KIND_SKIP` / :data:`KIND_POISON`, reasons enums.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from typing import Final, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from queue_processor import __version__
from queue_processor.observe.observer import Observer
from queue_processor.outcomes import (
    NTH_NODE_ACTIONS,
    SQS_MONITOR,
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
    "BLOCKED_BUDGETS_MAX",
    "DRAIN_BUCKETS",
    "ERROR_WHERE",
    "EVENT_TO_CORDON_BUCKETS",
    "KIND_POISON",
    "KIND_SKIP",
    "MONITOR_ERRORS",
    "NODE_ACTIONS",
    "OTHER_BUDGETS",
    "OUR_NODE_ACTIONS",
    "PREFIX",
    "Metrics",
    "NodeStatus",
]

#: Prefix of every metric that is not one of NTH's.
PREFIX: Final = "queue_processor"

#: ``kind`` label of a message that was skipped (valid, not acted on) or poison (not understood).
KIND_SKIP: Final = "skip"
KIND_POISON: Final = "poison"

#: ``node_action`` values of NTH's ``actions_total``, created at zero.
NODE_ACTIONS: Final = tuple(action.value for action in NodeAction if action in NTH_NODE_ACTIONS)
#: ``node_action`` values of ``queue_processor_node_actions_total`` (ours), created at zero.
OUR_NODE_ACTIONS: Final = tuple(action.value for action in NodeAction if action not in NTH_NODE_ACTIONS)
#: ``where`` values of ``queue_processor_errors_total``, created at zero.
ERROR_WHERE: Final = tuple(where.value for where in ErrorWhere)
#: The steps whose errors NTH counts in ``events_error_total{event_error_where="SQS_MONITOR"}``.
MONITOR_ERRORS: Final = frozenset({ErrorWhere.RECEIVE, ErrorWhere.BATCH})

#: Buckets of ``event_to_cordon_seconds``: 10 ms to 120 s, dense from 1 to 10 s to tell 3.5 s from 4 s.
EVENT_TO_CORDON_BUCKETS: Final = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    1.5,
    2,
    2.5,
    3,
    3.5,
    4,
    5,
    7.5,
    10,
    15,
    20,
    30,
    60,
    90,
    120,
)
#: Most PodDisruptionBudgets with a ``drain_blocked`` series of their own (the first by name).
BLOCKED_BUDGETS_MAX: Final = 50
#: The ``pdb`` label value of the budgets beyond :data:`BLOCKED_BUDGETS_MAX`.
OTHER_BUDGETS: Final = "other"

#: Buckets of ``drain_duration_seconds``: 0.5 s to 600 s.
DRAIN_BUCKETS: Final = (0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 450, 600)

NodeStatus = Literal["success", "error"]
"""``node_status`` of NTH's ``actions_total``."""


class _WithoutCreated(Collector):
    """``registry`` without prometheus-client's ``*_created`` samples (one more series per child; NTH had none)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            if family.type in ("counter", "histogram", "summary", "gaugehistogram"):
                family = copy.copy(family)
                family.samples = [sample for sample in family.samples if not sample.name.endswith("_created")]
            yield family


class Metrics(Observer):
    """The controller's metrics, one attribute each, in :attr:`registry`. ``version`` labels ``build_info``
    (default: the installed package's); ``process_metrics`` adds prometheus-client's process, platform and GC
    collectors. ``event_to_cordon_seconds`` excludes AWS's delivery delay. ``drained_pods_total{grace}``: ``own``
    (the whole grace), ``cut`` (cut to end before the instance), ``outlasted`` (killed mid-grace by its end)."""

    def __init__(self, version: str | None = None, *, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._exposed = _WithoutCreated(registry)
        if process_metrics:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)

        self.actions = Counter(
            "actions",
            "Actions taken on nodes (NTH-compatible).",
            ["node_action", "node_status"],
            registry=registry,
        )
        self.events_error = Counter(
            "events_error",
            "Errors while processing events, by where they happened (NTH-compatible).",
            ["event_error_where"],
            registry=registry,
        )

        self.nth_tagged_instances = Gauge(
            "nth_tagged_instances",
            "Instances carrying MANAGED_TAG, whatever their state (NTH-compatible; every 30 s).",
            registry=registry,
        )
        self.nth_tagged_nodes = Gauge(
            "nth_tagged_nodes",
            "Nodes whose providerID names an instance carrying MANAGED_TAG (NTH-compatible; every 30 s).",
            registry=registry,
        )

        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(name, doc, labels, namespace=PREFIX, registry=registry)

        def gauge(name: str, doc: str, labels: list[str] | None = None) -> Gauge:
            return Gauge(name, doc, labels or [], namespace=PREFIX, registry=registry)

        self.node_actions = counter(
            "node_actions", "Actions on nodes NTH has no name for, by result.", ["node_action", "node_status"]
        )
        self.errors = counter("errors", "Failed steps, by where they failed.", ["where"])
        self.messages_received = counter(
            "messages_received", "SQS messages received, by event kind.", ["queue", "kind"]
        )
        self.messages_deleted = counter(
            "messages_deleted", "SQS messages deleted (acknowledged), by event kind.", ["queue", "kind"]
        )
        self.messages_requeued = counter(
            "messages_requeued", "SQS messages made visible again after a backoff.", ["queue", "kind"]
        )
        self.messages_poison = counter(
            "messages_poison",
            "Poison SQS messages left to the redrive policy, by reason class.",
            ["queue", "reason"],
        )
        self.messages_skipped = counter(
            "messages_skipped",
            "Valid SQS messages acknowledged without action, by reason class.",
            ["queue", "reason_class"],
        )
        self.event_to_cordon = Histogram(
            "event_to_cordon_seconds",
            "Seconds from receiving an event's message to the node being cordoned.",
            namespace=PREFIX,
            buckets=EVENT_TO_CORDON_BUCKETS,
            registry=registry,
        )
        self.drain_duration = Histogram(
            "drain_duration_seconds",
            "Seconds a node's drain took, by event kind and result.",
            ["kind", "result"],
            namespace=PREFIX,
            buckets=DRAIN_BUCKETS,
            registry=registry,
        )
        self.in_flight_messages = gauge("in_flight_messages", "SQS messages received and not yet settled.")
        self.in_flight_operations = gauge("in_flight_operations", "Per-node operations under way.")
        self.draining_nodes = gauge("draining_nodes", "Nodes being drained.")
        self.waiting_drains = gauge(
            "drains_waiting",
            "Drains of events that leave time waiting for a turn (DRAIN_BUDGET_NON_URGENT), by group.",
            ["group"],
        )
        self.heartbeats = counter(
            "heartbeats", "RecordLifecycleActionHeartbeat calls, by result.", ["result"]
        )
        self.lifecycle_completions = counter(
            "lifecycle_completions", "CompleteLifecycleAction calls, by result.", ["result"]
        )
        self.operation_outcomes = counter(
            "operation_outcomes", "Operations that ended without a drain, by why.", ["outcome"]
        )
        self.evictions = counter("evictions", "Pod eviction requests, by result.", ["result"])
        self.drain_blocked_pods = gauge(
            "drain_blocked",
            "Pods whose eviction a PodDisruptionBudget refuses now, by budget (namespace/name).",
            ["pdb"],
        )
        self._blocked: dict[str, int] = {}
        self._blocked_series: set[str] = set()
        self.deleted_at_deadline_pods = counter(
            "pods_deleted_at_deadline",
            "Pods still on a node at its instance's end deleted by DELETE_AT_DEADLINE.",
            [],
        )
        self.surges = counter(
            "surges",
            "Pods annotated queue-processor/drain: surge, by whether their replacement was available first.",
            ["result"],
        )
        for result in SurgeResult:
            self.surges.labels(result=result)
        self.drained_pods = counter(
            "drained_pods",
            "Evicted pods by how their grace period went: own, cut (to end before the instance), outlasted.",
            ["grace"],
        )
        for grace in ("own", "cut", "outlasted"):
            self.drained_pods.labels(grace=grace)
        self.kube_requests = counter(
            "kube_requests", "Kubernetes API requests.", ["verb", "resource", "code"]
        )
        self.aws_requests = counter("aws_requests", "AWS API calls.", ["service", "operation", "result"])
        self.last_receive_timestamp = gauge(
            "last_receive_timestamp_seconds",
            "Unix time of the last ReceiveMessage call SQS answered.",
            ["queue"],
        )
        self.build_info = gauge("build_info", "Build information; always 1.", ["version"])
        self.build_info.labels(version=version or __version__).set(1)

        # Known label values start at zero, so rate() sees a series before its first increment.
        for status in ("success", "error"):
            for action in NODE_ACTIONS:
                self.actions.labels(node_action=action, node_status=status)
            for action in OUR_NODE_ACTIONS:
                self.node_actions.labels(node_action=action, node_status=status)
        self.events_error.labels(event_error_where=SQS_MONITOR)
        for where in ERROR_WHERE:
            self.errors.labels(where=where)
        for heartbeat in HeartbeatResult:
            self.heartbeats.labels(result=heartbeat)
        for outcome in OperationOutcome:
            self.operation_outcomes.labels(outcome=outcome)
        for completion in LifecycleResult:
            self.lifecycle_completions.labels(result=completion)
        for eviction in EvictionOutcome:
            self.evictions.labels(result=eviction)

    def message(self, queue: str, fate: MessageFate, kind: str) -> None:
        """Count a message received, deleted or requeued."""
        counter = {
            MessageFate.RECEIVED: self.messages_received,
            MessageFate.DELETED: self.messages_deleted,
            MessageFate.REQUEUED: self.messages_requeued,
        }[fate]
        counter.labels(queue, kind).inc()

    def poison(self, queue: str, reason_class: PoisonClass) -> None:
        """Count a poison message under its class."""
        self.messages_poison.labels(queue=queue, reason=reason_class).inc()

    def skipped(self, queue: str, reason_class: SkipClass) -> None:
        """Count a skipped message under its class."""
        self.messages_skipped.labels(queue=queue, reason_class=reason_class).inc()

    def receive_answered(self, queue: str) -> None:
        """Set ``last_receive_timestamp_seconds{queue}`` to now."""
        self.mark_receive(queue)

    def error(self, where: ErrorWhere) -> None:
        """Count ``where`` in ``errors_total``, and in NTH's ``events_error_total`` for :data:`MONITOR_ERRORS`."""
        self.errors.labels(where=where).inc()
        if where in MONITOR_ERRORS:
            self.events_error.labels(event_error_where=SQS_MONITOR).inc()

    def in_flight(self, messages: int, operations: int) -> None:
        """Set the in-flight gauges."""
        self.in_flight_messages.set(messages)
        self.in_flight_operations.set(operations)

    def draining(self, nodes: int) -> None:
        """Set ``draining_nodes``."""
        self.draining_nodes.set(nodes)

    def drains_waiting(self, group: str, drains: int) -> None:
        """Set ``drains_waiting{group}``."""
        self.waiting_drains.labels(group=group).set(drains)

    def node_action(self, action: NodeAction, ok: bool) -> None:
        """Count ``action`` in NTH's ``actions_total`` (:data:`NODE_ACTIONS`) or ours, ``success`` when ``ok``."""
        status: NodeStatus = "success" if ok else "error"
        counter = self.actions if action in NTH_NODE_ACTIONS else self.node_actions
        counter.labels(node_action=action, node_status=status).inc()

    def operation_outcome(self, outcome: OperationOutcome) -> None:
        """Count an operation that ended without a drain."""
        self.operation_outcomes.labels(outcome=outcome).inc()

    def cordoned(self, seconds: float) -> None:
        """Observe ``event_to_cordon_seconds``."""
        self.event_to_cordon.observe(seconds)

    def drained(self, kind: str, result: DrainOutcome | DrainEnd, seconds: float) -> None:
        """Observe ``drain_duration_seconds{kind, result}``."""
        self.drain_duration.labels(kind, str(result)).observe(seconds)

    def eviction(self, result: EvictionOutcome) -> None:
        """Count one pod's eviction by how it ended."""
        self.evictions.labels(result=result).inc()

    def drain_blocked(self, budget: str, pods: int) -> None:
        """Set ``drain_blocked{pdb}``: the first :data:`BLOCKED_BUDGETS_MAX` budgets by name, the rest summed."""
        self._blocked[budget] = pods
        if pods <= 0:
            del self._blocked[budget]
        shown = sorted(self._blocked)[:BLOCKED_BUDGETS_MAX]
        other = sum(count for name, count in self._blocked.items() if name not in shown)
        wanted = {name: self._blocked[name] for name in shown} | ({OTHER_BUDGETS: other} if other else {})
        for name in self._blocked_series - wanted.keys():
            self.drain_blocked_pods.remove(name)
        for name, count in wanted.items():
            self.drain_blocked_pods.labels(pdb=name).set(count)
        self._blocked_series = set(wanted)

    def pod_drained(self, grace: Literal["own", "cut", "outlasted"]) -> None:
        """Count one evicted pod under ``grace``."""
        self.drained_pods.labels(grace=grace).inc()

    def deleted_at_deadline(self) -> None:
        """Count one pod deleted at its instance's end."""
        self.deleted_at_deadline_pods.inc()

    def surge(self, result: SurgeResult) -> None:
        """Count one surge-annotated pod under ``result``."""
        self.surges.labels(result=result).inc()

    def heartbeat(self, result: HeartbeatResult) -> None:
        """Count a heartbeat; a call made also counts in ``node_actions_total{node_action="heartbeat"}``."""
        self.heartbeats.labels(result=result).inc()
        if result is not HeartbeatResult.HOOK_UNREADABLE:
            self.node_action(NodeAction.HEARTBEAT, result is HeartbeatResult.OK)

    def lifecycle_completion(self, result: LifecycleResult) -> None:
        """Count a CompleteLifecycleAction call."""
        self.lifecycle_completions.labels(result=result).inc()

    def kube_request(self, verb: str, resource: str, status: int | None) -> None:
        """Count a Kubernetes API request (``code`` ``"error"`` when no response came)."""
        self.kube_requests.labels(verb, resource, str(status) if status else "error").inc()

    def aws_request(self, service: str, operation: str, result: AwsResult) -> None:
        """Count an AWS API request."""
        self.aws_requests.labels(service, operation, result).inc()

    def mark_receive(self, queue: str, at: float | None = None) -> None:
        """Set ``last_receive_timestamp_seconds{queue}`` to Unix time ``at`` (seconds; default: now)."""
        self.last_receive_timestamp.labels(queue=queue).set(time.time() if at is None else at)

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (``text/plain; version=0.0.4``), without ``*_created``."""
        return generate_latest(self._exposed)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """``(body, content_type)`` in the format ``accept`` asks for: OpenMetrics, else Prometheus text."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self._exposed), content_type
