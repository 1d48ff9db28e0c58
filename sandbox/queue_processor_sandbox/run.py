"""Run the controller against a started :class:`~queue_processor_sandbox.environment.Sandbox` for one scenario,
watch it, and judge the end.

:func:`run_scenario` starts the controller in the current event loop (settings from the sandbox's env, plus
overrides), publishes the scenario's events, calls ``progress`` about every 0.2 s with a
:class:`Progress`, and stops when every message is settled (queue empty, dead-letter moves done) or at
``timeout_s`` (a scenario with a Spot or Capacity Reservation notice runs at least until the notice ends). The
summary it returns is the one ``queue-processor sandbox`` prints as its last line, and
:func:`as_expected` says whether the scenario ended as it should (DESIGN.md's rules as checks: no DaemonSet
pod evicted, no message left, no task left, every lifecycle action completed rather than timed out).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from queue_processor import rest
from queue_processor.app import Controller, run_controller
from queue_processor.cli import load_settings
from queue_processor_sandbox.cluster import drain_of
from queue_processor_sandbox.environment import SCENARIO_SETTINGS, Sandbox

__all__ = [
    "Progress",
    "as_expected",
    "cluster_figures",
    "deployment_after",
    "drain_figures",
    "judge",
    "last_pods_evicted_early",
    "most_draining_at_once",
    "run_scenario",
    "settle",
]


@dataclass
class Progress:
    """Where a scenario stands: nodes ``cordoned`` (unschedulable, or gone), pods ``evicted``, lifecycle
    actions ``completed`` / ``timed_out`` / ``open``, messages ``visible`` and ``in_flight`` in the queue,
    ``dlq`` in the dead-letter queue, and ``seconds`` since the scenario started."""

    cordoned: int = 0
    evicted: int = 0
    completed: int = 0
    timed_out: int = 0
    open: int = 0
    visible: int = 0
    in_flight: int = 0
    dlq: int = 0
    seconds: float = 0.0


def progress_of(sandbox: Sandbox, nodes: list[str], started: float) -> Progress:
    """A :class:`Progress` snapshot of the sandbox (messages: its queue's and its neighbours')."""
    wanted = set(nodes)
    # one pass over the nodes (the real backend serves it from its informer): nodes still schedulable
    schedulable = sandbox.kube.count(
        "nodes",
        lambda node: node["metadata"]["name"] in wanted and not (node.get("spec") or {}).get("unschedulable"),
    )
    cordoned = len(wanted) - schedulable
    actions = sandbox.aws.actions()
    visible, in_flight, dlq = sandbox.queue_counts()
    for neighbour in sandbox.neighbours:  # another cluster's queue (two-clusters): settled alike
        counts = neighbour.queue_counts()
        visible, in_flight, dlq = visible + counts.visible, in_flight + counts.in_flight, dlq + counts.dlq
    return Progress(
        cordoned=cordoned,
        evicted=len(sandbox.kube.evictions),
        completed=sum(1 for a in actions if a.status == "completed"),
        timed_out=sum(1 for a in actions if a.status == "timed-out"),
        open=sum(1 for a in actions if a.status == "open"),
        visible=visible,
        in_flight=in_flight,
        dlq=dlq,
        seconds=round(time.monotonic() - started, 2),
    )


def judge(sandbox: Sandbox, nodes: list[str], started: float) -> dict[str, Any]:
    """What the sandbox saw happen to ``nodes`` since ``started`` (``time.monotonic()``), whoever did it: the
    controller in this process, another process, several replicas, or aws-node-termination-handler. Read
    from the sandbox alone (its API server, its lifecycle actions, its queue):

    - ``drained``: nodes cordoned (or gone) with no pod left on them but DaemonSet and mirror pods;
    - ``cordoned``, ``evicted``, ``lifecycle_completed``, ``lifecycle_timed_out``, ``messages_left`` (visible
      and in flight), ``dlq``: as in :class:`Progress`;
    - ``daemonset_pods_evicted``: evicted pods a DaemonSet owns (kubectl drain leaves them);
    - ``heartbeats_after_end``: RecordLifecycleActionHeartbeat calls answered "No active Lifecycle Action"
      (the action was completed, abandoned or timed out already), and those that reached an open action
      while nobody held it: every message carrying the action was visible in its queue (released, or
      requeued and back) or gone;
    - ``nodes_drained_twice``: nodes one of whose pods was evicted by two drains (two drains at once, or a
      second drain of a node already drained): the drain is the one the eviction's User-Agent names
      (``drain/<id>``), and an eviction that names none (another client, NTH) is a drain of its own;
    - ``evictions_repeated``: evictions of a pod by a drain that had evicted it already (not a second drain:
      a retry after a connection reset the server had answered, or a grace period cut again when a nearer end
      joined the drain); the pod was terminating by then, so nothing more was disrupted;
    - ``evictions_denied``: eviction requests answered 403 Forbidden (RBAC on the real control plane; the
      emulation has none, and answers 403 only as an injected fault);
    - ``most_draining_at_once``: the most nodes of one Auto Scaling group among ``nodes`` whose evictions
      overlapped in time (from each node's first to its last eviction, the API server's times);
    - ``last_pods_evicted_early``: pods annotated ``queue-processor/drain: last`` whose first eviction came
      before the first eviction of an ordinary pod of the same node (no such annotation, no system priority
      class, ``spec.priority`` under 2,000,000,000): the annotation promises they go last;
    - ``fewest_ready_replicas`` (when the scenario watches a workload: surge): the lowest count of its Ready
      pods (Running, Ready, not terminating) at any change of its pods the API server published, from the
      scenario's start to now; ``None`` otherwise.
    """
    state = progress_of(sandbox, nodes, started)
    wanted = set(nodes)
    pods = sandbox.kube.objects("pods")
    busy = {
        pod["spec"].get("nodeName")
        for pod in pods
        if pod["spec"].get("nodeName") in wanted
        and not any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])
        and "kubernetes.io/config.mirror" not in (pod["metadata"].get("annotations") or {})
    }
    present = {node["metadata"]["name"]: node for node in sandbox.kube.objects("nodes")}
    drained = sum(
        1
        for name in nodes
        if name not in busy
        and (name not in present or (present[name].get("spec") or {}).get("unschedulable"))
    )
    evictions = sandbox.kube.evictions
    drains: dict[tuple[str, str, str], set[str]] = {}  # pod → the drains that evicted it
    repeated = 0
    for index, pod in enumerate(evictions):
        metadata = pod["metadata"]
        evicted_by = drain_of(pod) or f"unnamed-{index}"
        seen = drains.setdefault((metadata["namespace"], metadata["name"], metadata.get("uid", "")), set())
        repeated += evicted_by in seen
        seen.add(evicted_by)
    twice = {
        pod["spec"].get("nodeName")
        for pod in evictions
        if len(
            drains[(pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"].get("uid", ""))]
        )
        > 1
    }
    denied = sum(n for (_, what), n in sandbox.kube.denied().items() if "eviction" in what)
    return {
        "drained": drained,
        "cordoned": state.cordoned,
        "evicted": state.evicted,
        "lifecycle_completed": state.completed,
        "lifecycle_timed_out": state.timed_out,
        "daemonset_pods_evicted": sum(
            1
            for pod in evictions
            if any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])
        ),
        "messages_left": state.visible + state.in_flight,
        "dlq": state.dlq,
        "heartbeats_after_end": sum(
            1
            for call in sandbox.aws.calls()
            if call.operation == "RecordLifecycleActionHeartbeat"
            and ("No active Lifecycle Action" in call.outcome or call.held is False)
        ),
        "nodes_drained_twice": len(twice - {None}),
        "evictions_repeated": repeated,
        "evictions_denied": denied,
        "last_pods_evicted_early": last_pods_evicted_early(evictions),
        "most_draining_at_once": most_draining_at_once(sandbox, nodes),
        "fewest_ready_replicas": None if sandbox.ready_replicas is None else sandbox.ready_replicas.fewest,
        "seconds": state.seconds,
        "progress": asdict(state),
    }


async def run_scenario(
    sandbox: Sandbox,
    scenario: str,
    *,
    timeout_s: float = 120.0,
    overrides: dict[str, Any] | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> dict[str, Any]:
    """Run ``scenario`` with the controller; the summary (see the module docstring). Raises ``KeyError`` for an
    unknown scenario, and what the controller's start-up raises."""
    scaled = {  # the controller's own waits, in the sandbox's time
        "poison_visibility_timeout_sec": min(max(1, round(sandbox.clock.real(3600))), 2),
        "requeue_backoff_base_sec": max(0.1, sandbox.clock.real(10)),
        # a stop waits for the open long polls to end
        "receive_wait_time_sec": min(max(1, round(sandbox.clock.real(20))), 20),
        "grace_deadline_margin": sandbox.clock.real(10),
        "delete_at_deadline_lead": max(0.1, sandbox.clock.real(5)),
    }
    chosen: dict[str, Any] = {
        "prometheus_server_port": 0,
        "probes_server_port": 0,
        **scaled,
        **SCENARIO_SETTINGS.get(scenario, {}),
        **(overrides or {}),
    }
    settings = load_settings(**chosen)
    stop, ready = asyncio.Event(), asyncio.Event()
    controllers: list[Controller] = []

    def started_with(controller: Controller) -> None:
        controllers.append(controller)
        ready.set()

    task = asyncio.create_task(
        run_controller(
            settings, stop, kubeconfig=str(sandbox.kubeconfig_path), serve=False, started=started_with
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        task.result()
    started = time.monotonic()
    nodes = [i.private_dns_name for i in sandbox.instances]
    published = sandbox.publish(scenario)
    stop_others = asyncio.Event()
    others = [  # a controller for each other cluster the scenario started, on its own queue and API server
        asyncio.create_task(
            run_controller(
                load_settings(
                    **{
                        **chosen,
                        "queue_url": neighbour.env()["QUEUE_URL"],
                        "managed_tag_value": neighbour.name,
                        "pod_namespace": "kube-system",
                    }
                ),
                stop_others,
                kubeconfig=str(neighbour.kubeconfig_path),
                serve=False,
                started=controllers.append,
            ),
            name=f"controller-{neighbour.name}",
        )
        for neighbour in sandbox.neighbours
    ]
    await settle(sandbox, nodes, started, timeout_s, progress)
    try:
        stop_others.set()  # first: the sandbox's controller counts the tasks left in the loop when it stops
        await asyncio.gather(*others)  # a neighbour's controller that failed raises here
    finally:
        stop_others.set()
        await rest.stop(*others)
        stop.set()
        await task
    heartbeat_tasks = sum(
        1 for t in asyncio.all_tasks() if t.get_name().startswith("heartbeat-") and not t.done()
    )
    return {
        "scenario": scenario,
        "nodes": len(nodes),
        "published": published,
        **judge(sandbox, nodes, started),
        **(
            {"deployment_after": deployment_after(sandbox, published["deployment"])}
            if "deployment" in published
            else {}
        ),
        **({"clusters": cluster_figures(sandbox, published["leaving"])} if "leaving" in published else {}),
        **drain_figures(controllers[0]),
        "heartbeat_tasks_left": heartbeat_tasks,
        "operation_tasks_left": sum(controller.consumer.tasks for controller in controllers),
    }


async def settle(
    sandbox: Sandbox,
    nodes: list[str],
    started: float,
    timeout_s: float,
    progress: Callable[[Progress], None] | None = None,
) -> Progress:
    """Wait until the scenario has settled: nothing in any queue, no lifecycle action open and no notice still
    to end (its instance's termination publishes state changes that must be handled too), for a second; or
    until ``timeout_s`` seconds after ``started`` (``time.monotonic()``). ``progress`` gets a snapshot every
    0.2 s; the last one is returned."""
    state = Progress()
    settled_since: float | None = None
    while time.monotonic() - started < timeout_s:
        await asyncio.sleep(0.2)
        state = await asyncio.get_running_loop().run_in_executor(None, progress_of, sandbox, nodes, started)
        if progress is not None:
            progress(state)
        settled = (
            state.visible == 0
            and state.in_flight == 0
            and state.open == 0
            and sandbox.aws.notices_pending() == 0
        )
        settled_since = (settled_since or time.monotonic()) if settled else None
        if settled_since is not None and time.monotonic() - settled_since > 1.0:  # quiet for a second
            break
    return state


def cluster_figures(sandbox: Sandbox, leaving: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    """Per cluster of a scenario with several (two-clusters; the sandbox's own is the first key of ``leaving``,
    each other one a neighbour of that name): ``leaving`` (its nodes whose instances were interrupted),
    ``drained`` (of those: cordoned or gone, no pod left but DaemonSet and mirror pods), ``cordoned_elsewhere``
    and ``evicted_elsewhere`` (nodes cordoned, pods evicted, on its nodes that were not leaving: another
    cluster's controller, or a mistake), ``messages_left`` (visible and in flight in its queue) and ``dlq``."""
    figures: dict[str, dict[str, int]] = {}
    neighbours = {neighbour.name: neighbour for neighbour in sandbox.neighbours}
    for name, nodes in leaving.items():
        neighbour = neighbours.get(name)
        kube = neighbour.kube if neighbour is not None else sandbox.kube
        counts = neighbour.queue_counts() if neighbour is not None else sandbox.queue_counts()
        present = {node["metadata"]["name"]: node for node in kube.objects("nodes")}
        busy = {
            pod["spec"].get("nodeName")
            for pod in kube.objects("pods")
            if not any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])
            and "kubernetes.io/config.mirror" not in (pod["metadata"].get("annotations") or {})
        }
        figures[name] = {
            "leaving": len(nodes),
            "drained": sum(
                1
                for node in nodes
                if node not in busy
                and (node not in present or (present[node].get("spec") or {}).get("unschedulable"))
            ),
            "cordoned_elsewhere": sum(
                1
                for node_name, node in present.items()
                if node_name not in nodes and (node.get("spec") or {}).get("unschedulable")
            ),
            "evicted_elsewhere": sum(1 for pod in kube.evictions if pod["spec"].get("nodeName") not in nodes),
            "messages_left": counts.visible + counts.in_flight,
            "dlq": counts.dlq,
        }
    return figures


def deployment_after(sandbox: Sandbox, deployment: str) -> dict[str, Any]:
    """The Deployment ``namespace/name`` a scenario watched, as it ends: ``replicas`` (``spec.replicas``) and
    whether it still carries a surge record (``surge_record``, the annotation ``queue-processor/surge``)."""
    namespace, name = deployment.split("/")
    found = sandbox.kube.get_raw(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")  # type: ignore[attr-defined]
    assert found is not None, deployment
    return {
        "replicas": found["spec"]["replicas"],
        "surge_record": _SURGE_RECORD in (found["metadata"].get("annotations") or {}),
    }


def drain_figures(controller: Controller) -> dict[str, Any]:
    """What the controller's drains did, from its metrics (``queue_processor_drained_pods_total``):
    ``pods_finished_grace`` (evicted pods that had all of their own grace period), ``pods_cut_short`` (given a
    grace period cut to end before the instance), ``pods_killed_mid_grace`` (their own grace period ended after
    the instance did), ``pods_deleted_at_deadline`` (DELETE_AT_DEADLINE), ``pods_surged`` (SURGE_DRAINS: evicted
    once their replacement was available), ``drains`` (ended, any result) and
    ``drain_seconds_mean``."""
    registry = controller.metrics.registry

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return registry.get_sample_value(name, labels or {}) or 0.0

    def durations(suffix: str) -> float:  # "_count" or "_sum" of the drain histogram, over every label set
        return sum(
            s.value
            for family in registry.collect()
            if family.name == "queue_processor_drain_duration_seconds"
            for s in family.samples
            if s.name.endswith(suffix)
        )

    drains, seconds = durations("_count"), durations("_sum")
    return {
        "pods_finished_grace": int(sample("queue_processor_drained_pods_total", {"grace": "own"})),
        "pods_cut_short": int(sample("queue_processor_drained_pods_total", {"grace": "cut"})),
        "pods_killed_mid_grace": int(sample("queue_processor_drained_pods_total", {"grace": "outlasted"})),
        "pods_deleted_at_deadline": int(sample("queue_processor_pods_deleted_at_deadline_total")),
        "pods_surged": int(sample("queue_processor_surges_total", {"result": "surged"})),
        "drains": int(drains),
        "drain_seconds_mean": round(seconds / drains, 2) if drains else 0.0,
    }


#: The annotation whose ``last`` value the judge checks (the sandbox's own spelling of it, not the controller's).
_DRAIN_ANNOTATION = "queue-processor/drain"
_SURGE_RECORD = "queue-processor/surge"
_SYSTEM_CLASSES = ("system-cluster-critical", "system-node-critical")


def most_draining_at_once(sandbox: Sandbox, nodes: list[str]) -> int:
    """``most_draining_at_once`` of :func:`judge`."""
    first, last = sandbox.kube.first_eviction, sandbox.kube.last_eviction
    group_of = {instance.private_dns_name: instance.asg_name for instance in sandbox.instances}
    spans: dict[str, list[tuple[Any, Any]]] = {}
    for node in nodes:
        if node in first and node in last:
            spans.setdefault(group_of.get(node, ""), []).append((first[node], last[node]))
    return max((_most_overlapping(group) for group in spans.values()), default=0)


def _most_overlapping(spans: list[tuple[Any, Any]]) -> int:
    """The most of ``spans`` (start, end) that share a moment (ends inclusive)."""
    edges = sorted([(start, 0) for start, _ in spans] + [(end, 1) for _, end in spans])
    most = running = 0
    for _, kind in edges:
        running += 1 if kind == 0 else -1
        most = max(most, running)
    return most


def last_pods_evicted_early(
    evictions: list[dict[str, Any]], late: frozenset[tuple[str, str]] = frozenset()
) -> int:
    """``last_pods_evicted_early`` of :func:`judge`, from the evictions in the order the API server took them;
    ``late`` pods (namespace, name) are left out: pods a drain found bound to its node after its first list
    (the controller's ``looked again`` line), or whose eviction a budget refused (they go when it lets them),
    when the pods annotated last may have gone already. Only pods of one drain are compared when both name
    theirs (:func:`~queue_processor_sandbox.cluster.drain_of`): a node back in service and drained again has
    new pods."""
    firsts: dict[tuple[str, str, str], dict[str, Any]] = {}  # each pod's first eviction, in order
    for pod in evictions:
        metadata = pod["metadata"]
        firsts.setdefault((metadata["namespace"], metadata["name"], metadata.get("uid", "")), pod)
    ordered = list(firsts.values())
    return sum(
        1
        for index, pod in enumerate(ordered)
        if _annotated_last(pod)
        and any(
            later["spec"].get("nodeName") == pod["spec"].get("nodeName")
            and _same_drain(pod, later)
            and _ordinary(later)
            and (later["metadata"]["namespace"], later["metadata"]["name"]) not in late
            for later in ordered[index + 1 :]
        )
    )


def _same_drain(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two evictions may be of one drain: the same drain ID, or one of them names none."""
    first, second = drain_of(one), drain_of(other)
    return first is None or second is None or first == second


def _annotated_last(pod: dict[str, Any]) -> bool:
    return ((pod["metadata"].get("annotations") or {}).get(_DRAIN_ANNOTATION) or "").strip() == "last"


def _ordinary(pod: dict[str, Any]) -> bool:
    """Neither annotated ``last`` nor critical, and not the controller's own pod (labelled
    ``app.kubernetes.io/name: queue-processor``, as the chart's are), which it evicts after every other pod of its
    node (it leaves its node last)."""
    spec = pod.get("spec") or {}
    priority = spec.get("priority")
    critical = spec.get("priorityClassName") in _SYSTEM_CLASSES or (
        isinstance(priority, int) and priority >= 2_000_000_000
    )
    labels = (pod.get("metadata") or {}).get("labels") or {}
    controller = labels.get("app.kubernetes.io/name") == "queue-processor"
    return not _annotated_last(pod) and not critical and not controller


def as_expected(summary: dict[str, Any]) -> bool:
    """Whether a scenario ended as it should: nothing left behind anywhere, no DaemonSet pod evicted, no pod
    annotated ``last`` evicted before an ordinary pod of its node, no lifecycle action left to time out,
    poison (only) in the dead-letter queue, and for ``rebalance-fleet`` no more drains of a group at once
    than its budget, for ``surge`` never fewer Ready replicas of the Deployment than it began with, and the Deployment
    ending as it began (its replica count, no surge record)."""
    scenario = summary["scenario"]
    clean = bool(
        summary["messages_left"] == 0
        and summary["daemonset_pods_evicted"] == 0
        and summary["last_pods_evicted_early"] == 0
        and summary["heartbeat_tasks_left"] == 0
        and summary["operation_tasks_left"] == 0
        and summary["lifecycle_timed_out"] == 0
    )
    if scenario == "poison":
        return clean and bool(summary["dlq"] == summary["published"]["poison"])
    if scenario == "rebalance-fleet":  # its budget held: no two nodes of a group drained at once
        clean = clean and summary["most_draining_at_once"] <= int(summary["published"]["budget"])
    if scenario == "two-clusters":  # each cluster drained its own leaving nodes, and nothing else
        clean = clean and all(
            figures["drained"] == figures["leaving"]
            and figures["cordoned_elsewhere"] == figures["evicted_elsewhere"] == 0
            and figures["messages_left"] == figures["dlq"] == 0
            for figures in summary["clusters"].values()
        )
    if scenario == "surge":  # never fewer Ready replicas than it began with, and the node drained
        fewest = summary["fewest_ready_replicas"]
        clean = clean and fewest is not None and fewest >= summary["published"]["replicas"]
        clean = clean and summary["drained"] >= 1
        clean = clean and summary["deployment_after"] == {
            "replicas": summary["published"]["replicas"],
            "surge_record": False,
        }
    return clean and bool(summary["dlq"] == 0)
