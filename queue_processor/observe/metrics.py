"""What the pipeline reports: :class:`Metrics`, its Prometheus registry (:data:`Observer` to the pipeline). "Metric
and label naming" (prometheus.io); NTH's (``pkg/observability/opentelemetry.go``) are unprefixed for its dashboards."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder

from queue_processor import __version__
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

#: Prefix of every metric that is not one of NTH's.
PREFIX: Final = "queue_processor"
#: NTH's metrics, unprefixed.
NTH_FAMILIES: Final = frozenset({"actions", "events_error", "nth_tagged_instances", "nth_tagged_nodes"})

#: Buckets of the histograms (seconds).
BUCKETS: Final = {
    "event_to_cordon_seconds": (
        *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 7.5, 10),
        *(15, 20, 30, 60, 90, 120),
    ),
    "drain_duration_seconds": (0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 450, 600),
}
#: Most PodDisruptionBudgets with a ``drain_blocked`` series of their own (the first by name).
BLOCKED_BUDGETS_MAX: Final = 50
#: The ``pdb`` label value of the budgets beyond :data:`BLOCKED_BUDGETS_MAX`.
OTHER_BUDGETS: Final = "other"

#: Every metric in exposition order, two lines each: ``attribute type name label...``, then its help.
FAMILIES: Final = """
actions counter actions node_action node_status
    Actions taken on nodes (NTH-compatible).
events_error counter events_error event_error_where
    Errors while processing events, by where they happened (NTH-compatible).
nth_tagged_instances gauge nth_tagged_instances
    Instances carrying MANAGED_TAG, whatever their state (NTH-compatible; every 30 s).
nth_tagged_nodes gauge nth_tagged_nodes
    Nodes whose providerID names an instance carrying MANAGED_TAG (NTH-compatible; every 30 s).
node_actions counter node_actions node_action node_status
    Actions on nodes NTH has no name for, by result.
errors counter errors where
    Failed steps, by where they failed.
messages_received counter messages_received queue kind
    SQS messages received, by event kind.
messages_deleted counter messages_deleted queue kind
    SQS messages deleted (acknowledged), by event kind.
messages_requeued counter messages_requeued queue kind
    SQS messages made visible again after a backoff.
messages_poison counter messages_poison queue reason
    Poison SQS messages left to the redrive policy, by reason class.
messages_skipped counter messages_skipped queue reason_class
    Valid SQS messages acknowledged without action, by reason class.
event_to_cordon histogram event_to_cordon_seconds
    Seconds from receiving an event's message to the node being cordoned.
drain_duration histogram drain_duration_seconds kind result
    Seconds a node's drain took, by event kind and result.
in_flight_messages gauge in_flight_messages
    SQS messages received and not yet settled.
in_flight_operations gauge in_flight_operations
    Per-node operations under way.
draining_nodes gauge draining_nodes
    Nodes being drained.
waiting_drains gauge drains_waiting group
    Drains of events that leave time waiting for a turn (DRAIN_BUDGET_NON_URGENT), by group.
heartbeats counter heartbeats result
    RecordLifecycleActionHeartbeat calls, by result.
lifecycle_completions counter lifecycle_completions result
    CompleteLifecycleAction calls, by result.
operation_outcomes counter operation_outcomes outcome
    Operations that ended without a drain, by why.
evictions counter evictions result
    Pod eviction requests, by result.
drain_blocked_pods gauge drain_blocked pdb
    Pods whose eviction a PodDisruptionBudget refuses now, by budget (namespace/name).
deleted_at_deadline_pods counter pods_deleted_at_deadline
    Pods still on a node at its instance's end deleted by DELETE_AT_DEADLINE.
surges counter surges result
    Pods annotated queue-processor/drain: surge, by whether their replacement was available first.
drained_pods counter drained_pods grace
    Evicted pods by how their grace period went: own, cut (to end before the instance), outlasted.
kube_requests counter kube_requests verb resource code
    Kubernetes API requests.
aws_requests counter aws_requests service operation result
    AWS API calls.
last_receive_timestamp gauge last_receive_timestamp_seconds queue
    Unix time of the last ReceiveMessage call SQS answered.
build_info gauge build_info version
    Build information; always 1.
"""

#: Label values whose series start at zero, so rate() sees a series before its first increment.
ZERO_SERIES: Final[dict[str, Iterable[Iterable[str]]]] = {
    "surges": [(result,) for result in SurgeResult],
    "drained_pods": [("own",), ("cut",), ("outlasted",)],
    "actions": [(a, s) for s in ("success", "error") for a in NodeAction if a in NTH_NODE_ACTIONS],
    "node_actions": [(a, s) for s in ("success", "error") for a in NodeAction if a not in NTH_NODE_ACTIONS],
    "events_error": [(SQS_MONITOR,)],
    "errors": [(where,) for where in ErrorWhere],
    "heartbeats": [(result,) for result in HeartbeatResult],
    "operation_outcomes": [(outcome,) for outcome in OperationOutcome],
    "lifecycle_completions": [(result,) for result in LifecycleResult],
    "evictions": [(result,) for result in EvictionOutcome],
}
#: The steps whose errors NTH counts in ``events_error_total{event_error_where="SQS_MONITOR"}``.
MONITOR_ERRORS: Final = frozenset({ErrorWhere.RECEIVE, ErrorWhere.BATCH})


_TYPES: Final = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
# NTH's metrics had no ``*_created`` samples, nor have ours (prometheus-client's switch, for the process).
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client


class Metrics:
    """What the pipeline reports, as the metrics of :data:`FAMILIES` in :attr:`registry`; methods never raise.
    ``queue``: a queue URL as configured; ``kind``: an event kind, kinds joined by commas, ``skip`` or ``poison``;
    times in seconds. ``version`` labels ``build_info``; ``process_metrics``: process, platform and GC collectors."""

    actions: Counter
    events_error: Counter
    nth_tagged_instances: Gauge
    nth_tagged_nodes: Gauge
    node_actions: Counter
    errors: Counter
    messages_received: Counter
    messages_deleted: Counter
    messages_requeued: Counter
    messages_poison: Counter
    messages_skipped: Counter
    event_to_cordon: Histogram
    drain_duration: Histogram
    in_flight_messages: Gauge
    in_flight_operations: Gauge
    draining_nodes: Gauge
    waiting_drains: Gauge
    heartbeats: Counter
    lifecycle_completions: Counter
    operation_outcomes: Counter
    evictions: Counter
    drain_blocked_pods: Gauge
    deleted_at_deadline_pods: Counter
    surges: Counter
    drained_pods: Counter
    kube_requests: Counter
    aws_requests: Counter
    last_receive_timestamp: Gauge
    build_info: Gauge

    def __init__(self, version: str | None = None, *, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        if process_metrics:
            for collector in (ProcessCollector, PlatformCollector, GCCollector):
                collector(registry=self.registry)
        rows = FAMILIES.strip().splitlines()
        for row, doc in zip(rows[::2], rows[1::2], strict=True):
            attribute, kind, name, *labels = row.split()
            namespace = "" if name in NTH_FAMILIES else PREFIX
            options: dict[str, Any] = {"buckets": BUCKETS[name]} if kind == "histogram" else {}
            family = _TYPES[kind](
                name, doc.strip(), labels, namespace=namespace, registry=self.registry, **options
            )
            setattr(self, attribute, family)
            for values in ZERO_SERIES.get(attribute, ()):
                family.labels(*values)
        self.build_info.labels(version=version or __version__).set(1)
        self._blocked: dict[str, int] = {}
        self._blocked_series: set[str] = set()

    def message(self, queue: str, fate: MessageFate, kind: str) -> None:
        """A message was received, deleted or requeued."""
        counter = {
            MessageFate.RECEIVED: self.messages_received,
            MessageFate.DELETED: self.messages_deleted,
            MessageFate.REQUEUED: self.messages_requeued,
        }[fate]
        counter.labels(queue, kind).inc()

    def poison(self, queue: str, reason_class: PoisonClass) -> None:
        """A poison message was left to the redrive policy."""
        self.messages_poison.labels(queue=queue, reason=reason_class).inc()

    def skipped(self, queue: str, reason_class: SkipClass) -> None:
        """A valid message that is not acted on was deleted."""
        self.messages_skipped.labels(queue=queue, reason_class=reason_class).inc()

    def error(self, where: ErrorWhere) -> None:
        """Count ``where`` in ``errors_total``, and in NTH's ``events_error_total`` for :data:`MONITOR_ERRORS`."""
        self.errors.labels(where=where).inc()
        if where in MONITOR_ERRORS:
            self.events_error.labels(event_error_where=SQS_MONITOR).inc()

    def in_flight(self, messages: int, operations: int) -> None:
        """Messages held and operations under way, now."""
        self.in_flight_messages.set(messages)
        self.in_flight_operations.set(operations)

    def draining(self, nodes: int) -> None:
        """Nodes being drained, now (bounded by DRAIN_BUDGET)."""
        self.draining_nodes.set(nodes)

    def drains_waiting(self, group: str, drains: int) -> None:
        """Drains of ``group`` waiting for a turn now (DRAIN_BUDGET_NON_URGENT)."""
        self.waiting_drains.labels(group=group).set(drains)

    def node_action(self, action: NodeAction, ok: bool) -> None:
        """Count ``action`` in NTH's ``actions_total`` (``NTH_NODE_ACTIONS``) or ours, ``success`` when ``ok``."""
        counter = self.actions if action in NTH_NODE_ACTIONS else self.node_actions
        counter.labels(node_action=action, node_status="success" if ok else "error").inc()

    def operation_outcome(self, outcome: OperationOutcome) -> None:
        """An operation ended without a drain."""
        self.operation_outcomes.labels(outcome=outcome).inc()

    def cordoned(self, seconds: float) -> None:
        """A node was cordoned ``seconds`` after its operation's first message was received."""
        self.event_to_cordon.observe(seconds)

    def drained(self, kind: str, result: DrainOutcome | DrainEnd, seconds: float) -> None:
        """A node's drain of the given event kind ended with ``result`` after ``seconds``."""
        self.drain_duration.labels(kind, str(result)).observe(seconds)

    def eviction(self, result: EvictionOutcome) -> None:
        """One pod's eviction ended with ``result``."""
        self.evictions.labels(result=result).inc()

    def drain_blocked(self, budget: str, pods: int) -> None:
        """``budget`` (``namespace/name``) now refuses ``pods`` evictions, across drains: ``drain_blocked{pdb}``
        for the first :data:`BLOCKED_BUDGETS_MAX` budgets by name, the rest summed."""
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
        """An evicted pod's grace: ``own`` (whole), ``cut`` (to end before the instance), ``outlasted`` (killed)."""
        self.drained_pods.labels(grace=grace).inc()

    def deleted_at_deadline(self) -> None:
        """A pod still on a node at its instance's end was deleted (DELETE_AT_DEADLINE)."""
        self.deleted_at_deadline_pods.inc()

    def surge(self, result: SurgeResult) -> None:
        """A pod annotated ``queue-processor/drain: surge`` got its replacement first, or why not."""
        self.surges.labels(result=result).inc()

    def heartbeat(self, result: HeartbeatResult) -> None:
        """A heartbeat was sent (or, ``hook-unreadable``, cannot be); one sent also counts as a node action."""
        self.heartbeats.labels(result=result).inc()
        if result is not HeartbeatResult.HOOK_UNREADABLE:
            self.node_action(NodeAction.HEARTBEAT, result is HeartbeatResult.OK)

    def lifecycle_completion(self, result: LifecycleResult) -> None:
        """A CompleteLifecycleAction call ended with ``result``."""
        self.lifecycle_completions.labels(result=result).inc()

    def kube_request(self, verb: str, resource: str, status: int | None) -> None:
        """A Kubernetes API request; ``status``: the HTTP status, ``None`` (code ``error``) when no answer came."""
        self.kube_requests.labels(verb, resource, str(status) if status else "error").inc()

    def aws_request(self, service: str, operation: str, result: AwsResult) -> None:
        """An AWS API request: ``service`` as botocore names it (``sqs``), ``operation`` (``ReceiveMessage``)."""
        self.aws_requests.labels(service, operation, result).inc()

    def receive_answered(self, queue: str, at: float | None = None) -> None:
        """SQS answered a ReceiveMessage on ``queue`` (messages or none) at Unix time ``at`` (default: now)."""
        self.last_receive_timestamp.labels(queue=queue).set(time.time() if at is None else at)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """``(body, content_type)`` in the format ``accept`` asks for: OpenMetrics, else Prometheus text."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


#: What a component reports to (a test may subclass it to watch one kind of report).
Observer = Metrics
#: The observer of components built without one: metrics nobody serves.
NULL_OBSERVER = Metrics(process_metrics=False)
