"""One workload, one system, one fresh sandbox on the real control plane: what ``benchmarks/versus_nth.py`` and
``tests/peers/`` run for aws-node-termination-handler (NTH) and for queue-processor alike.

:func:`run_workload` builds a :class:`~queue_processor_sandbox.environment.Sandbox` (``kubernetes="real"``,
sharing the given control plane), starts the system as its own process (:class:`nth.Nth`
or ``queue-processor run``), waits until it serves its probe, publishes the workload's messages, watches
every node until the work is done or the workload's bound passes, stops the process (SIGTERM) and returns
:class:`Figures`: the judge's verdict (:func:`~queue_processor_sandbox.run.judge`) plus latencies, API
requests and memory.

Systems (:data:`SYSTEMS`): ``nth`` is NTH v1.25.6 with its Helm chart's defaults for queue-processor mode
(``WORKERS=10``, no heartbeats); ``nth_tuned`` raises ``WORKERS`` to the number of nodes and sends heartbeats
(``HEARTBEAT_INTERVAL=30``, its minimum) as its users do (its Kubernetes client's QPS and burst cannot be
raised: ``KUBE_API_QPS``/``KUBE_API_BURST`` are on NTH's unreleased main only, so client-go's 5 and 10 hold);
``queue_processor`` is ``queue-processor run`` with its defaults.
"""

from __future__ import annotations

import contextlib
import http.server
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nth import Nth
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.processes import Process, QueueProcessor, Samples, peak_rss_mib, scrape
from queue_processor_sandbox.run import judge

if TYPE_CHECKING:
    from queue_processor_sandbox.control_plane import ControlPlane

__all__ = ["SYSTEMS", "WORKLOADS", "Figures", "Workload", "run_workload", "start_system"]

SYSTEMS = ("nth", "nth_tuned", "queue_processor")

#: How long a system may take to exit after SIGTERM before it is SIGKILLed (``exit_status`` -9); the Helm
#: charts of both give 30 s.
STOP_BOUND_S = 60.0

#: How long a run waits for the namespaces of earlier runs on the shared control plane to finish terminating
#: (their pods deleted by the namespace and pod garbage collectors) before it starts: real seconds.
QUIET_BOUND_S = 600.0

#: A Spot interruption warning's notice (EC2 User Guide, "Spot Instance interruption notices"): simulated s.
SPOT_NOTICE_S = 120.0


@dataclass(frozen=True)
class Published:
    """What a workload published: ``nodes`` (node name → ``time.monotonic()`` its first message was sent),
    the lifecycle action ``tokens`` it opened, when each node's instance goes (``ends``, monotonic; absent
    for a node whose instance stays until its action is completed), and the nodes that must stay in service
    (``kept``)."""

    nodes: dict[str, float]
    tokens: list[str] = field(default_factory=list)
    ends: dict[str, float] = field(default_factory=dict)
    #: Nodes that must end schedulable (instances that launched into service).
    kept: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Workload:
    """A named input: the sandbox ``options``, ``publish`` (puts the messages in the queue, returns
    :class:`Published`), per-system extra settings ``env`` (NTH's or queue-processor's own names), and
    ``bound_s``: real seconds after publishing by which the work must be done (the run stops there)."""

    name: str
    options: SandboxOptions
    publish: Callable[[Sandbox], Published]
    bound_s: float
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    describe: str = ""
    #: With a template, every system posts its webhook (WEBHOOK_URL, WEBHOOK_TEMPLATE) to a local receiver;
    #: the figures carry the bodies (``webhook_bodies``), NTH's ``actions_total`` samples (``actions``) and
    #: the Kubernetes Events on the published nodes and the run's pods (``event_reasons``; set
    #: EMIT_KUBERNETES_EVENTS in ``env``): what an NTH user's alerts, dashboards and receivers read.
    webhook_template: str | None = None


def _first(sandbox: Sandbox, count: int) -> list[Any]:
    return sandbox.instances[:count]


def _spot_warnings(sandbox: Sandbox, nodes: int) -> Published:
    """A Spot interruption warning for each of the first ``nodes`` instances, each notice ending 120 s
    (simulated) after it is sent."""
    sent, ends = {}, {}
    for instance in _first(sandbox, nodes):
        sent[instance.private_dns_name] = time.monotonic()
        sandbox.aws.spot_interruption(instance.instance_id)
        ends[instance.private_dns_name] = time.monotonic() + sandbox.clock.real(SPOT_NOTICE_S)
    return Published(sent, ends=ends)


def spot_storm(nodes: int, *, scale: float = 1.0) -> Workload:
    """``nodes`` Spot warnings at once (plus a quarter as many spare nodes for the pods), 10 pods per node
    from 10 ReplicaSets with PodDisruptionBudgets (maxUnavailable 30 %)."""
    spare = max(1, nodes // 4)

    def publish(sandbox: Sandbox) -> Published:
        return _spot_warnings(sandbox, nodes)

    return Workload(
        name="spot-storm",
        options=SandboxOptions(
            nodes=nodes + spare,
            scale=scale,
            cluster=ClusterSpec(apps=10, pdb_max_unavailable="30%", empty_dir_pods=0, unreplicated_pods=0),
        ),
        publish=publish,
        bound_s=SPOT_NOTICE_S * scale + 60,
        env={"nth_tuned": {"WORKERS": str(nodes)}},
        describe=f"{nodes} Spot warnings at once, {spare} spare nodes, 10 pods per node, PDBs 30 %",
    )


def _held_scale_in(sandbox: Sandbox, nodes: int, hold_s: float, *, duplicates: bool) -> Published:
    """The first ``nodes`` instances scaled in through the terminate hook while the PodDisruptionBudget of
    ``app-000`` allows no eviction, relaxed to maxUnavailable 1 after ``hold_s`` (simulated) seconds; with
    ``duplicates``, each instance also gets a rebalance recommendation and a state change to ``stopping``."""
    namespace = sandbox.cluster.namespace
    sandbox.kube.set_pdb(namespace, "app-000", max_unavailable=0)
    sent: dict[str, float] = {}
    tokens: list[str] = []
    for instance in _first(sandbox, nodes):
        sent[instance.private_dns_name] = time.monotonic()
        tokens += [action.token for action in sandbox.aws.terminate_instance(instance.instance_id)]
        if duplicates:
            sandbox.aws.rebalance_recommendation(instance.instance_id)
            sandbox.aws.publish_state_change(instance.instance_id, "stopping")
    sandbox.after(hold_s, lambda: sandbox.kube.set_pdb(namespace, "app-000", max_unavailable=1))
    return Published(sent, tokens)


def _held_options(nodes: int, heartbeat_timeout_s: int) -> SandboxOptions:
    """Twice ``nodes`` nodes (the others take the evicted pods), two ReplicaSets of two pods per node."""
    return SandboxOptions(
        nodes=nodes * 2,
        heartbeat_timeout_s=heartbeat_timeout_s,
        cluster=ClusterSpec(apps=2, replicas_per_node=2, pdb_max_unavailable=1),
    )


def asg_scale_in(nodes: int, *, heartbeat_timeout_s: int = 60, hold_s: float = 90.0) -> Workload:
    """``nodes`` instances leave through a terminate lifecycle hook whose HeartbeatTimeout
    (``heartbeat_timeout_s``) is shorter than their drains: a PodDisruptionBudget allows no eviction for
    ``hold_s`` seconds. Each instance also gets a rebalance recommendation and a state change to
    ``stopping`` (duplicates for the same instance)."""

    def publish(sandbox: Sandbox) -> Published:
        return _held_scale_in(sandbox, nodes, hold_s, duplicates=True)

    return Workload(
        name="asg-scale-in",
        options=_held_options(nodes, heartbeat_timeout_s),
        publish=publish,
        bound_s=hold_s + 2 * heartbeat_timeout_s + 30,
        env={"nth_tuned": {"WORKERS": str(max(10, nodes)), "HEARTBEAT_INTERVAL": "30"}},
        describe=(
            f"{nodes} terminate lifecycle actions (HeartbeatTimeout {heartbeat_timeout_s} s), drains held "
            f"{hold_s:.0f} s by a PDB, plus a rebalance recommendation and a state change per instance"
        ),
    )


def drain_fails(
    nodes: int, *, hold_s: float = 60.0, drain_timeout_s: int = 30, heartbeat_timeout_s: int = 60
) -> Workload:
    """``nodes`` instances leave through a terminate hook (HeartbeatTimeout ``heartbeat_timeout_s``) while a
    PodDisruptionBudget allows no eviction for ``hold_s`` seconds, longer than the drain timeout both systems
    get (``NODE_TERMINATION_GRACE_PERIOD=drain_timeout_s``): every first drain fails, is retried, and
    succeeds once the budget allows. NTH's seeds: a heartbeat goroutine left running after a failed drain,
    and repeated drains. The run lasts until everything settled or ``hold_s + heartbeat_timeout_s + 30`` s:
    a heartbeat left running shows within one interval of the end of the action it kept alive."""

    def publish(sandbox: Sandbox) -> Published:
        return _held_scale_in(sandbox, nodes, hold_s, duplicates=False)

    timeout = {"NODE_TERMINATION_GRACE_PERIOD": str(drain_timeout_s)}
    return Workload(
        name="drain-fails",
        options=_held_options(nodes, heartbeat_timeout_s),
        publish=publish,
        bound_s=hold_s + heartbeat_timeout_s + 30,
        env={
            "nth": timeout,
            "nth_tuned": {**timeout, "WORKERS": str(max(10, nodes)), "HEARTBEAT_INTERVAL": "30"},
            "queue_processor": timeout,
        },
        describe=(
            f"{nodes} terminate lifecycle actions (HeartbeatTimeout {heartbeat_timeout_s} s), every drain "
            f"blocked by a PDB for {hold_s:.0f} s, longer than the {drain_timeout_s} s drain timeout"
        ),
    )


def apiserver_cache(nodes: int, *, scale: float = 0.25) -> Workload:
    """``nodes`` Spot warnings with pods listed from the API server's cache (``USE_APISERVER_CACHE=true``
    for both systems) on nodes that run a DaemonSet pod, a mirror pod, an emptyDir pod and an unreplicated pod
    beside the ReplicaSets' pods (NTH's seed: DaemonSet pods evicted on that path). NTH also emits Kubernetes
    Events here (``EMIT_KUBERNETES_EVENTS=true``): in v1.25.6 its cache path evicts the pods it listed for
    those Events."""

    def publish(sandbox: Sandbox) -> Published:
        return _spot_warnings(sandbox, nodes)

    nth = {"USE_APISERVER_CACHE": "true", "EMIT_KUBERNETES_EVENTS": "true"}
    return Workload(
        name="apiserver-cache",
        options=SandboxOptions(nodes=nodes + 2, scale=scale, cluster=ClusterSpec(apps=3)),
        publish=publish,
        bound_s=SPOT_NOTICE_S * scale + 30,
        env={
            "nth": nth,
            "nth_tuned": {**nth, "WORKERS": str(max(10, nodes))},
            "queue_processor": {"USE_APISERVER_CACHE": "true"},
        },
        describe=f"{nodes} Spot warnings, pods listed from the API server's cache, DaemonSet and mirror pods",
    )


def warm_pool(instances: int, *, heartbeat_timeout_s: int = 60) -> Workload:
    """``instances`` instances launch into the first group's warm pool (their own bootstrap completes those
    launch actions, as a warm-pool user data script does), then as many warmed instances move into the group:
    their launch actions (HeartbeatTimeout ``heartbeat_timeout_s``) wait for a controller to see the node
    Ready. NTH's seed: "No active Lifecycle Action found" and instances killed after the hook timed out."""

    def publish(sandbox: Sandbox) -> Published:
        group = sandbox.instances[0].asg_name
        autoscaling = sandbox.aws.client("autoscaling")
        warmed = sandbox.aws.launch_instances(group, instances, origin="EC2", destination="WarmPool")
        tokens: list[str] = []
        for instance in warmed:
            for action in sandbox.aws.actions(instance.instance_id, status="open"):
                tokens.append(action.token)
                autoscaling.complete_lifecycle_action(
                    AutoScalingGroupName=group,
                    LifecycleHookName=action.hook_name,
                    LifecycleActionToken=action.token,
                    LifecycleActionResult="CONTINUE",
                )
        moved = sandbox.aws.launch_instances(
            group, instances, origin="WarmPool", destination="AutoScalingGroup"
        )
        for instance in moved:
            tokens += [action.token for action in sandbox.aws.actions(instance.instance_id, status="open")]
        return Published({}, tokens, kept=[instance.private_dns_name for instance in moved])

    return Workload(
        name="warm-pool",
        options=SandboxOptions(
            nodes=2, heartbeat_timeout_s=heartbeat_timeout_s, node_register_s=10.0, node_ready_s=5.0
        ),
        publish=publish,
        bound_s=heartbeat_timeout_s + 30,
        describe=(
            f"{instances} launches into a warm pool (completed by their bootstrap), then {instances} warmed "
            f"instances into the group (launch hook HeartbeatTimeout {heartbeat_timeout_s} s)"
        ),
    )


@dataclass
class Figures:
    """What one run measured (see ``docs/benchmarks.md`` for what bounds each)."""

    values: dict[str, Any]
    #: (seconds since publishing, nodes cordoned, nodes drained) samples, for the picture.
    timeline: list[tuple[float, int, int]]


class _Watch(threading.Thread):
    """Samples the sandbox's nodes and pods (the real backend's informers) every ``interval_s``: when each
    watched node was first seen cordoned (unschedulable, or gone) and drained (no pod but DaemonSet and mirror
    pods left on it, or gone). ``started`` (``time.monotonic()``) is the timeline's zero."""

    def __init__(self, sandbox: Sandbox, nodes: set[str], started: float, interval_s: float = 0.25) -> None:
        super().__init__(daemon=True, name="sidebyside-watch")
        self.sandbox, self.nodes, self.interval_s = sandbox, nodes, interval_s
        self.cordoned: dict[str, float] = {}
        self.drained: dict[str, float] = {}
        self.samples: list[tuple[float, int, int]] = []
        self.started = started
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        now = time.monotonic()
        present = {n["metadata"]["name"]: n for n in self.sandbox.kube.objects("nodes")}
        busy = set()
        for pod in self.sandbox.kube.objects("pods"):
            owners = pod["metadata"].get("ownerReferences") or []
            mirror = "kubernetes.io/config.mirror" in (pod["metadata"].get("annotations") or {})
            if not mirror and not any(ref.get("kind") == "DaemonSet" for ref in owners):
                busy.add(pod["spec"].get("nodeName"))
        for name in self.nodes:
            node = present.get(name)
            cordoned = node is None or bool((node.get("spec") or {}).get("unschedulable"))
            if cordoned:
                self.cordoned.setdefault(name, now)
                if node is None or name not in busy:
                    self.drained.setdefault(name, now)
        self.samples.append((round(now - self.started, 2), len(self.cordoned), len(self.drained)))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def start_system(system: str, sandbox: Sandbox, log: Path, extra: dict[str, str]) -> Process:
    """Start ``system`` (one of :data:`SYSTEMS`) against ``sandbox``, logging to ``log``. Raises
    ``ValueError`` for an unknown system and what :class:`nth.Nth` raises."""
    if system in ("nth", "nth_tuned"):
        return Nth(sandbox, log, **extra)
    if system != "queue_processor":
        raise ValueError(f"unknown system {system!r}: one of {', '.join(SYSTEMS)}")
    return QueueProcessor(sandbox, log, **extra)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def run_workload(
    system: str,
    workload: Workload,
    *,
    plane: ControlPlane,
    workdir: Path,
    ready_timeout_s: float = 60.0,
    quiet_timeout_s: float | None = None,
) -> Figures:
    """Run ``workload`` against ``system`` on a fresh sandbox sharing ``plane``; its figures. The system's log
    is ``workdir/<system>.log``. Raises ``RuntimeError`` when the system exits before it is ready or is not
    ready within ``ready_timeout_s`` seconds. With ``quiet_timeout_s`` it first waits for earlier runs'
    namespaces to finish terminating (:func:`wait_quiet`; the benchmark passes :data:`QUIET_BOUND_S`): a run
    after a large one otherwise shares the machine with the deletion of its thousands of pods, which takes
    about a minute even when small (orphaned pods wait for the pod garbage collector)."""
    extra = dict(workload.env.get(system, {}))
    if quiet_timeout_s is not None:
        wait_quiet(plane, quiet_timeout_s)
    receiver = _Receiver() if workload.webhook_template is not None else None
    if receiver is not None:
        extra |= {"WEBHOOK_URL": receiver.url, "WEBHOOK_TEMPLATE": workload.webhook_template or ""}
    with (
        Sandbox(workload.options, workdir=workdir / "sandbox", kubernetes="real", plane=plane) as sandbox,
        receiver if receiver is not None else contextlib.nullcontext(),
    ):
        process = start_system(system, sandbox, workdir / f"{system}.log", extra)
        try:
            _wait_ready(process, system, ready_timeout_s)
            requests_before = _requests(sandbox, process)
            started = time.monotonic()
            published = workload.publish(sandbox)
            watch = _Watch(sandbox, set(published.nodes), started)
            watch.start()
            try:
                deadline = started + workload.bound_s
                while time.monotonic() < deadline and not _done(sandbox, published, watch):
                    time.sleep(0.5)
            finally:
                watch.stop()
            verdict = judge(sandbox, list(published.nodes), started)
            requests = _requests(sandbox, process) - requests_before
            nodes = {node["metadata"]["name"]: node for node in sandbox.kube.objects("nodes")}
            kept_cordoned = sum(
                1
                for name in published.kept
                if ((nodes.get(name) or {}).get("spec") or {}).get("unschedulable")
            )
            mirror_evicted = sum(
                1
                for pod in sandbox.kube.evictions
                if "kubernetes.io/config.mirror" in (pod["metadata"].get("annotations") or {})
            )
            rss = peak_rss_mib(process.process.pid)
            # NTH counts a message's post-drain after it deleted the message, which ended the run: with a
            # receiver (the runs that compare actions) its counts are read once every node's is in, or at the bound
            samples = _scrape_settled(process, len(published.nodes) if receiver is not None else 0)
            reasons = _event_reasons(sandbox, set(published.nodes)) if receiver is not None else {}
        finally:
            try:
                status = process.stop(signal.SIGTERM, STOP_BOUND_S)
            except AssertionError:  # still running after the bound: SIGKILLed, recorded as such
                status = -signal.SIGKILL
        cordon = [watch.cordoned[n] - sent for n, sent in published.nodes.items() if n in watch.cordoned]
        inside = sum(
            1 for node, end in published.ends.items() if node in watch.drained and watch.drained[node] <= end
        )
        values = {
            "nodes": len(published.nodes),
            "p50_cordon_s": _percentile(cordon, 0.50),
            "p99_cordon_s": _percentile(cordon, 0.99),
            "all_drained_s": (
                round(max(watch.drained.values()) - started, 2)
                if published.nodes and len(watch.drained) == len(published.nodes)
                else None
            ),
            "drains_inside_notice_fraction": (
                round(inside / len(published.ends), 3) if published.ends else None
            ),
            **{key: verdict[key] for key in _JUDGED},
            "mirror_pods_evicted": mirror_evicted,
            "kept_nodes_cordoned": kept_cordoned,
            "kube_requests_per_node": round(requests / max(1, len(published.nodes)), 1),
            # A system that drained fewer nodes made fewer requests: per node it drained, too.
            "kube_requests_per_drained_node": (
                round(requests / verdict["drained"], 1) if verdict["drained"] else None
            ),
            "peak_rss_mib": rss,
            "exit_status": status,
            "seconds": round(time.monotonic() - started, 1),
        }
        if receiver is not None:
            values["webhook_bodies"] = sorted(receiver.bodies)
            values["actions"] = {
                f"{labels['node_action']}/{labels['node_status']}": value
                for labels, value in samples.get("actions_total", [])
                if "node_action" in labels
            }
            values["event_reasons"] = reasons
        return Figures(values, watch.samples)


#: How long (seconds) a run that compares actions waits for the last post-drain to be counted.
SETTLE_BOUND_S = 15.0


def _scrape_settled(process: Process, post_drains: int) -> Samples:
    """The process's metrics samples (``scrape``'s shape; ``{}`` once it has exited), read again every 0.2 s
    until its ``actions_total`` samples for ``node_action="post-drain"`` add up to ``post_drains`` or
    ``SETTLE_BOUND_S`` seconds have passed; a run judges whatever the last read holds."""
    deadline = time.monotonic() + SETTLE_BOUND_S
    while True:
        try:
            samples = scrape(process.metrics_port)
        except OSError:  # exited: no metrics to read
            return {}
        counted = sum(
            value
            for labels, value in samples.get("actions_total", [])
            if labels.get("node_action") == "post-drain"
        )
        if counted >= post_drains or time.monotonic() >= deadline:
            return samples
        time.sleep(0.2)


_JUDGED = (
    "drained",
    "lifecycle_completed",
    "lifecycle_timed_out",
    "heartbeats_after_end",
    "nodes_drained_twice",
    "daemonset_pods_evicted",
    "messages_left",
    "dlq",
    "evicted",
)


def _event_reasons(sandbox: Sandbox, nodes: set[str]) -> dict[str, int]:
    """``"<kind>/<reason>"`` → how many times it was recorded (Event ``count``s summed), for the Events NTH
    or queue-processor recorded on ``nodes`` and on the pods of the sandbox's namespace."""
    reasons: dict[str, int] = {}
    for event in sandbox.kube.objects("events"):
        involved = event.get("involvedObject") or {}
        kind = involved.get("kind")
        ours = (kind == "Node" and involved.get("name") in nodes) or (
            kind == "Pod" and involved.get("namespace") == sandbox.cluster.namespace
        )
        component = (event.get("source") or {}).get("component") or event.get("reportingComponent")
        if ours and component in ("aws-node-termination-handler", "queue-processor"):
            key = f"{kind}/{event['reason']}"
            reasons[key] = reasons.get(key, 0) + int(event.get("count") or 1)
    return dict(sorted(reasons.items()))


class _Receiver(http.server.ThreadingHTTPServer):
    """A webhook receiver on 127.0.0.1 (a context manager serving on a thread): ``bodies`` of the POSTs."""

    def __init__(self) -> None:
        bodies: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                bodies.append(self.rfile.read(length).decode("utf-8", "replace"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.bodies = bodies
        self.url = f"http://127.0.0.1:{self.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.serve_forever, name="webhook-receiver", daemon=True)

    def __enter__(self) -> _Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


def wait_quiet(plane: ControlPlane, timeout_s: float) -> None:
    """Block until no namespace of ``plane`` is terminating; raises ``TimeoutError`` after ``timeout_s``
    real seconds, naming them."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = plane.request("GET", "/api/v1/namespaces")["items"]
        terminating = [
            ns["metadata"]["name"] for ns in listed if (ns.get("status") or {}).get("phase") == "Terminating"
        ]
        if not terminating:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"namespaces still terminating after {timeout_s} s: {', '.join(terminating)}")
        time.sleep(1.0)


def _wait_ready(process: Process, system: str, timeout_s: float) -> None:
    path = "/readyz" if system == "queue_processor" else "/healthz"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.process.poll() is not None:
            raise RuntimeError(f"{system} exited with {process.process.returncode}: {process.lines()[-5:]}")
        if process.get(path)[0] == 200:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{system} not ready in {timeout_s} s: {process.lines()[-5:]}")


def _requests(sandbox: Sandbox, process: Process) -> int:
    """Kubernetes API requests the system made so far (the API server's audit log, by its user)."""
    return sum(sandbox.kube.requests_by(process.username).values())  # type: ignore[attr-defined]


def _done(sandbox: Sandbox, published: Published, watch: _Watch) -> bool:
    """Every node drained, every lifecycle action settled, the queue empty."""
    if len(watch.drained) < len(published.nodes):
        return False
    if any(sandbox.aws.action(token).status == "open" for token in published.tokens):
        return False
    return sandbox.queue_counts().left == 0


#: The workloads by name, at the sizes ``benchmarks/versus_nth.py`` runs by default.
WORKLOADS: dict[str, Callable[[], Workload]] = {
    "spot-storm": lambda: spot_storm(200),
    "asg-scale-in": lambda: asg_scale_in(10),
    "drain-fails": lambda: drain_fails(5),
    "apiserver-cache": lambda: apiserver_cache(10),
    "warm-pool": lambda: warm_pool(3),
}
