"""Prometheus metrics of the controller: one :class:`Metrics` object per process (tests create many).

Every metric lives in the object's own :class:`prometheus_client.CollectorRegistry`, never in the library's
global one, so two :class:`Metrics` never collide. Names follow the Prometheus conventions ("Metric and label
naming", prometheus.io): base units (seconds), ``_total`` for counters, ``_seconds`` for durations and
timestamps, ``_info``-style constant gauges for build facts.

Two families are kept from aws-node-termination-handler (NTH, ``pkg/observability/opentelemetry.go``) with its
names and label names and **no prefix**, so dashboards and alerts written for NTH keep working:

- ``actions_total{node_action, node_status}``: NTH's ``actions`` counter (the low-cardinality one; NTH's
  deprecated ``actions_node_total`` with node name and event ID labels is not kept). ``node_status`` is
  ``success`` or ``error``; ``node_action`` is one of :data:`NODE_ACTIONS` (``pre-drain``, ``cordon``,
  ``cordon-and-drain``, ``post-drain``), counted where NTH v1.25.6 counts them in queue-processor mode (see
  :class:`~queue_processor.outcomes.NodeAction`): ``cordon`` only with CORDON_ONLY, ``pre-drain``
  not for state changes. Messages coalesced into one operation on one node count once, where NTH, which
  handles each message on its own, counts each.
- ``events_error_total{event_error_where}``: NTH's ``events.error`` counter; in queue-processor mode its only
  ``event_error_where`` is ``SQS_MONITOR`` (:data:`~queue_processor.outcomes.SQS_MONITOR`), counted
  when a ReceiveMessage call fails or a non-empty batch has no message that could be processed.

Our own versions of both name every step: ``queue_processor_node_actions_total{node_action, node_status}``
(``taint``, ``exclude-from-lb``, ``out-of-service-taint``, ``heartbeat``, ``lifecycle-complete``,
``launch-ready``) and ``queue_processor_errors_total{where}`` (:data:`ERROR_WHERE`: ``receive``, ``batch``,
``parse``, ``handle``, ``delete``, ``requeue``, ``visibility``).

Every other metric is ours and carries the ``queue_processor_`` prefix; see :class:`Metrics` for the list.

Label conventions, so that label sets stay small and bounded:

- ``queue``: the queue URL as configured (``QUEUE_URL`` / ``QUEUE_URLS``); URLs, not names, because two
  regions or accounts may hold queues of the same name.
- ``kind``: an :class:`~queue_processor.events.EventKind` value (``spot-interruption``...), or ``"skip"`` /
  ``"poison"`` (:data:`KIND_SKIP`, :data:`KIND_POISON`) for a message that gave no event.
- ``reason`` (poison) and ``reason_class`` (skip): the parser's
  :class:`~queue_processor.outcomes.PoisonClass` / :class:`~queue_processor.outcomes.SkipClass`, never
  its free-text reason (which holds IDs and would explode cardinality).

:class:`Metrics` is the :class:`~queue_processor.observe.observer.Observer` the controller runs with: the
pipeline calls its methods, never the counters directly.
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

#: ``node_action`` values of ``actions_total`` (NTH's), created at zero so that ``rate()`` and ``increase()``
#: see the series before the first interruption.
NODE_ACTIONS: Final = tuple(action.value for action in NodeAction if action in NTH_NODE_ACTIONS)
#: ``node_action`` values of ``queue_processor_node_actions_total`` (ours), created at zero.
OUR_NODE_ACTIONS: Final = tuple(action.value for action in NodeAction if action not in NTH_NODE_ACTIONS)
#: ``where`` values of ``queue_processor_errors_total``, created at zero.
ERROR_WHERE: Final = tuple(where.value for where in ErrorWhere)
#: The steps whose errors NTH counts as its SQS monitor's (``events_error_total{event_error_where="SQS_MONITOR"}``).
MONITOR_ERRORS: Final = frozenset({ErrorWhere.RECEIVE, ErrorWhere.BATCH})

#: Buckets of ``queue_processor_event_to_cordon_seconds``: 10 ms to 120 s (a Spot notice), 0.5 s apart from 1
#: to 4 s, 1 s apart to 5 s and 2.5 s apart to 10 s, where a storm's p99 lies (1,000 cordons at 200 requests a
#: second take 5 s): a p99 judged against a bound of a few seconds needs buckets that can tell 3.5 s from 4 s.
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
#: Buckets of ``queue_processor_drain_duration_seconds``: 0.5 s to 600 s (10 minutes).
#: Most PodDisruptionBudgets with a ``drain_blocked`` series of their own (the first by name).
BLOCKED_BUDGETS_MAX: Final = 50
#: The ``pdb`` label value of the budgets beyond :data:`BLOCKED_BUDGETS_MAX`.
OTHER_BUDGETS: Final = "other"

DRAIN_BUCKETS: Final = (0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 450, 600)

NodeStatus = Literal["success", "error"]
"""``node_status`` of NTH's ``actions_total``."""


class _WithoutCreated(Collector):
    """The families of ``registry`` without prometheus-client's ``*_created`` samples: in the text format
    each would be one more gauge series per counter or histogram child, which NTH never exposed and no
    dashboard reads."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            if family.type in ("counter", "histogram", "summary", "gaugehistogram"):
                family = copy.copy(family)
                family.samples = [sample for sample in family.samples if not sample.name.endswith("_created")]
            yield family


class Metrics(Observer):
    """The controller's metrics, registered in :attr:`registry` (a registry of their own).

    ``version`` is the ``version`` label of ``queue_processor_build_info`` (default: the installed
    package's); ``process_metrics`` adds prometheus-client's process (``process_cpu_seconds_total``,
    ``process_resident_memory_bytes``...), platform (``python_info``) and garbage-collector collectors.

    NTH's, unprefixed (see the module docstring):

    - :attr:`actions`: ``actions_total{node_action, node_status}`` (counter);
    - :attr:`events_error`: ``events_error_total{event_error_where}`` (counter, ``SQS_MONITOR`` only).

    Ours, prefixed ``queue_processor_`` (``queue``, ``kind`` and reason labels: see the module docstring):

    - :attr:`node_actions`: ``node_actions_total{node_action, node_status}``, the actions on nodes NTH has
      no name for (:data:`OUR_NODE_ACTIONS`);
    - :attr:`errors`: ``errors_total{where}``, failed steps (:data:`ERROR_WHERE`);
    - :attr:`messages_received`: ``messages_received_total{queue, kind}``, messages received from SQS,
      counted once parsed;
    - :attr:`messages_deleted`: ``messages_deleted_total{queue, kind}``, messages deleted (acknowledged);
    - :attr:`messages_requeued`: ``messages_requeued_total{queue, kind}``, messages made visible again after
      a backoff (EarlyExit);
    - :attr:`messages_poison`: ``messages_poison_total{queue, reason}``, poison messages left to the
      redrive policy, ``reason`` a :class:`~queue_processor.outcomes.PoisonClass`;
    - :attr:`messages_skipped`: ``messages_skipped_total{queue, reason_class}``, valid messages not acted
      on, ``reason_class`` a :class:`~queue_processor.outcomes.SkipClass`;
    - :attr:`event_to_cordon`: ``event_to_cordon_seconds`` (histogram, :data:`EVENT_TO_CORDON_BUCKETS`),
      seconds from receiving the message that carried an event to the node's cordon succeeding (our
      latency; AWS's delivery delay is not included);
    - :attr:`drain_duration`: ``drain_duration_seconds{kind, result}`` (histogram, :data:`DRAIN_BUCKETS`),
      seconds from the start of a node's drain to its end, ``result`` a
      :data:`~queue_processor.observe.observer.DrainEnd`;
    - :attr:`in_flight_messages`: ``in_flight_messages`` (gauge), received messages not yet deleted or
      requeued;
    - :attr:`in_flight_operations`: ``in_flight_operations`` (gauge), per-node operations under way;
    - :attr:`draining_nodes`: ``draining_nodes`` (gauge), nodes being drained (bounded by DRAIN_BUDGET);
    - :attr:`waiting_drains`: ``drains_waiting{group}`` (gauge), drains of events that leave time waiting for
      a turn of their group (DRAIN_BUDGET_NON_URGENT);
    - :attr:`heartbeats`: ``heartbeats_total{result}``, RecordLifecycleActionHeartbeat calls
      (:class:`~queue_processor.outcomes.HeartbeatResult`);
    - :attr:`operation_outcomes`: ``operation_outcomes_total{outcome}``, operations that ended without a
      drain (:class:`~queue_processor.outcomes.OperationOutcome`);
    - :attr:`lifecycle_completions`: ``lifecycle_completions_total{result}``, CompleteLifecycleAction calls
      (:class:`~queue_processor.outcomes.LifecycleResult`);
    - :attr:`evictions`: ``evictions_total{result}``, pods whose eviction ended, by how
      (:class:`~queue_processor.outcomes.EvictionOutcome`);
    - :attr:`drain_blocked`: ``drain_blocked{pdb}`` (gauge), pods whose eviction the PodDisruptionBudget
      ``pdb`` (``namespace/name``) refuses now, across drains; a series goes when its count is 0, and at
      most :data:`BLOCKED_BUDGETS_MAX` budgets have their own series (the others count under ``other``);
    - :attr:`deleted_at_deadline_pods`: ``pods_deleted_at_deadline_total``, pods deleted by DELETE_AT_DEADLINE;
    - :attr:`surges`: ``surges_total{result}``, pods annotated ``queue-processor/drain: surge`` by whether
      their replacement was available first (:class:`~queue_processor.outcomes.SurgeResult`; SURGE_DRAINS);
    - :attr:`drained_pods`: ``drained_pods_total{grace}``, evicted pods by how their grace period went: all
      of their own (``own``: ending before the instance's end when it is known, else gone before the drain
      ended), cut to end before the instance (``cut``), or their own ending after the instance's end
      (``outlasted``: killed mid-grace when the instance goes);
    - :attr:`kube_requests`: ``kube_requests_total{verb, resource, code}``, Kubernetes API requests:
      ``verb`` as in audit logs (``get``, ``list``, ``patch``, ``create``, ``delete``...), ``resource`` the
      plural (``nodes``, ``pods``, ``pods/eviction``, ``leases``...), ``code`` the HTTP status (``"200"``)
      or ``"error"`` when no response came;
    - :attr:`aws_requests`: ``aws_requests_total{service, operation, result}``, AWS API calls
      (``sqs`` / ``ReceiveMessage``, ``autoscaling`` / ``CompleteLifecycleAction``...), ``result`` an
      :data:`~queue_processor.observe.observer.AwsResult`;
    - :attr:`last_receive_timestamp`: ``last_receive_timestamp_seconds{queue}`` (gauge), Unix time in
      seconds of the last ReceiveMessage call that SQS answered (with or without messages);
    - :attr:`build_info`: ``build_info{version}`` (gauge, always 1).
    """

    def __init__(self, version: str | None = None, *, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._exposed = _WithoutCreated(registry)
        if process_metrics:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)

        # --- NTH's, unprefixed
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

        # --- ours
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

    # --- the Observer (see queue_processor.observe.observer for what each reports)

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
        """Count one error in ``queue_processor_errors_total``, and in NTH's ``events_error_total`` when NTH
        would (:data:`MONITOR_ERRORS`)."""
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
        """Count one action on a node in NTH's ``actions_total`` (:data:`NODE_ACTIONS`) or in
        ``queue_processor_node_actions_total``: ``node_status`` is ``success`` when ``ok``, else ``error``."""
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
        """Set ``drain_blocked{pdb}``: the budget's own series while fewer than :data:`BLOCKED_BUDGETS_MAX`
        budgets have one, else ``other`` (the sum of those without); a series at 0 is removed."""
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
        """Record that SQS answered a ReceiveMessage call on ``queue`` at Unix time ``at`` (seconds;
        default: now)."""
        self.last_receive_timestamp.labels(queue=queue).set(time.time() if at is None else at)

    # --- exposition

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text exposition format (``text/plain; version=0.0.4``), without
        the ``*_created`` series prometheus-client would add to each counter and histogram."""
        return generate_latest(self._exposed)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """Every metric in the format the ``Accept`` header ``accept`` asks for (OpenMetrics when asked,
        else Prometheus text), with its content type: ``(body, content_type)``. Like :meth:`exposition`,
        without ``*_created`` series."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self._exposed), content_type
