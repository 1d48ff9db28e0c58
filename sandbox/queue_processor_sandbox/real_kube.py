"""The sandbox's Kubernetes side on a real control plane (:mod:`queue_processor_sandbox.control_plane`).

:class:`RealKube` offers what :class:`~queue_processor_sandbox.kube.KubeSandbox` offers the sandbox and the tests
(add nodes and workloads, read the cluster, count requests, list evictions), but every answer comes from a real
kube-apiserver with its real controllers, scheduler and KWOK's fake kubelets:

- Nodes are created with KWOK's annotation, so KWOK makes them Ready (after ``ready_after_s``) and keeps their
  Leases; pods bound to them turn Running; a deleted pod disappears when its grace period has passed.
- ReplicaSets and DaemonSets get their pods from kube-controller-manager, placed by kube-scheduler: a ReplicaSet
  spread over the nodes it is given (a ``topologySpreadConstraints`` on the hostname), a DaemonSet on every node
  of this sandbox (a node selector on the sandbox's run label).
- PodDisruptionBudget status is the disruption controller's; :meth:`RealKube.add_pdb` and
  :meth:`RealKube.set_pdb` wait until it has observed the budget's generation.
- Evictions, request counts and HTTP 403s are read from the API server's audit log.

Every object it creates carries the label ``sandbox.queue-processor.dev/run=<run>``; nodes and pods are mirrored
by a list-then-watch informer for cheap polling (:meth:`RealKube.count`, :meth:`RealKube.objects`,
:meth:`RealKube.pods_on`); :meth:`RealKube.get` reads the API server. :meth:`RealKube.stop` deletes this run's
nodes and namespaces, so several sandboxes can share one control plane, one after another or at once.

Durations are simulated seconds scaled by the :class:`~queue_processor_sandbox.clock.SandboxClock`; a pod's
``terminationGracePeriodSeconds`` is a whole number of real seconds, so a scaled grace is rounded up (never to 0
when it was not 0).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.cluster import MANUAL_STATUS, eviction_record
from queue_processor_sandbox.control_plane import KWOK_NODE, READY_AT, ControlPlane

__all__ = ["RUN_LABEL", "RealKube"]

Obj = dict[str, Any]
Key = tuple[str, str]

#: Label on every object a :class:`RealKube` creates: its run ID.
RUN_LABEL = "sandbox.queue-processor.dev/run"

#: API paths of the resources the sandbox reads, by plural (cluster-wide list paths).
PATHS = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "events": "/api/v1/events",
    "daemonsets": "/apis/apps/v1/daemonsets",
    "replicasets": "/apis/apps/v1/replicasets",
    "poddisruptionbudgets": "/apis/policy/v1/poddisruptionbudgets",
    "leases": "/apis/coordination.k8s.io/v1/leases",
}


def _object_path(plural: str, name: str, namespace: str = "") -> str:
    base = PATHS[plural]
    if namespace:
        prefix, resource = base.rsplit("/", 1)
        return f"{prefix}/namespaces/{namespace}/{resource}/{name}"
    return f"{base}/{name}"


def _key(obj: Obj) -> Key:
    return (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])


class _Informer:
    """List, then watch, one resource with a label selector, in a thread; keeps the latest version of every
    object (:attr:`objects`) and the last version of deleted ones (:attr:`gone`)."""

    def __init__(self, plane: ControlPlane, plural: str, selector: str) -> None:
        self.plane = plane
        self.plural = plural
        self.selector = selector
        self.objects: dict[Key, Obj] = {}
        self.gone: dict[Key, Obj] = {}
        self.lock = threading.Lock()
        self.changed: list[Callable[[dict[Key, Obj]], None]] = []
        """Called with :attr:`objects`, under :attr:`lock`, after each change the informer applies."""
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._connection: http.client.HTTPSConnection | None = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{plural}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        connection = self._connection
        if connection is not None and connection.sock is not None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list()
                rv = self._watch(rv)
            except (OSError, http.client.HTTPException, ValueError):
                if self._stop.wait(0.2):
                    return
                rv = ""

    def _request(self, query: dict[str, str]) -> http.client.HTTPResponse:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.plane.port, context=self.plane.ssl_context(), timeout=None
        )
        self._connection = connection
        path = f"{PATHS[self.plural]}?{urllib.parse.urlencode({'labelSelector': self.selector, **query})}"
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise ValueError(f"{path}: HTTP {response.status}")
        return response

    def _list(self) -> str:
        response = self._request({})
        answer = json.loads(response.read())
        response.close()
        items = {_key(item): item for item in answer["items"]}
        with self.lock:
            for key, old in self.objects.items():
                if key not in items:
                    self.gone[key] = old
            self.objects = items
            self._tell()
        self.synced.set()
        return str(answer["metadata"]["resourceVersion"])

    def _watch(self, rv: str) -> str:
        response = self._request(
            {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
        )
        try:
            for line in response:
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    return ""  # 410 Gone: relist
                rv = str(obj["metadata"].get("resourceVersion") or rv)
                if kind == "BOOKMARK":
                    continue
                key = _key(obj)
                with self.lock:
                    if kind == "DELETED":
                        self.objects.pop(key, None)
                        self.gone[key] = obj
                    else:
                        self.objects[key] = obj
                    self._tell()
        finally:
            response.close()
        return rv

    def _tell(self) -> None:
        for changed in self.changed:
            changed(self.objects)


class ReadyReplicas:
    """The Ready pods (Running, Ready, not terminating: what a ReplicaSet counts as ready) of one workload,
    counted at every change of this run's pods the informer sees, from :meth:`RealKube.track_ready` until
    :meth:`stop`: ``fewest`` is the lowest count seen, ``now`` the latest, ``history`` each change as (wall-clock
    seconds, the names of the Ready pods)."""

    def __init__(self, informer: _Informer, namespace: str, labels: dict[str, str]) -> None:
        self._informer = informer
        self.namespace = namespace
        self.labels = dict(labels)
        self.now = 0
        self.fewest: int | None = None
        self.history: list[tuple[float, frozenset[str]]] = []
        with informer.lock:
            self._count(informer.objects)
            informer.changed.append(self._count)

    def _count(self, objects: dict[Key, Obj]) -> None:
        ready = frozenset(
            pod["metadata"]["name"]
            for pod in objects.values()
            if pod["metadata"].get("namespace") == self.namespace
            and _labels_match(pod, self.labels)
            and _pod_ready(pod)
        )
        self.now = len(ready)
        if not self.history or self.history[-1][1] != ready:
            self.history.append((time.time(), ready))
        self.fewest = self.now if self.fewest is None else min(self.fewest, self.now)

    def stop(self) -> None:
        """Stop counting."""
        with self._informer.lock, contextlib.suppress(ValueError):
            self._informer.changed.remove(self._count)


class RealKube:
    """One sandbox's cluster on a real control plane. ``plane``: a started :class:`ControlPlane` to share
    (else :meth:`start` starts one of its own and :meth:`stop` stops it). ``run``: the run ID (random when
    omitted). Use as a context manager or call :meth:`start`/:meth:`stop`.

    Raises :class:`~queue_processor_sandbox.control_plane.ControlPlaneError` from :meth:`start` when there is
    no control plane to start; ``TimeoutError`` when the cluster does not reach a state it waits for.
    """

    def __init__(
        self,
        clock: SandboxClock | None = None,
        *,
        plane: ControlPlane | None = None,
        run: str | None = None,
        wait_timeout_s: float = 120.0,
    ) -> None:
        self.clock = clock or SandboxClock()
        self.plane = plane or ControlPlane()
        self._owns_plane = plane is None
        self.run = run or uuid.uuid4().hex[:8]
        self.wait_timeout_s = wait_timeout_s
        self.lock = threading.RLock()
        self.admin_user = "queue-processor-test-admin"
        self._nodes: _Informer | None = None
        self._pods: _Informer | None = None
        self._namespaces: set[str] = set()
        self._node_names: set[str] = set()
        self._timers: list[threading.Timer] = []
        self._audit_offset = 0
        self._requests: Counter[str] = Counter()
        self._by_user: Counter[tuple[str, str, int]] = Counter()
        self._evictions: list[Obj] = []
        # Evictions read from the audit log (pod, stage time, User-Agent), pod not resolved yet.
        self._pending: collections.deque[tuple[Key, str, str]] = collections.deque()
        self._last_eviction: dict[str, datetime] = {}
        self._first_eviction: dict[str, datetime] = {}

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The API server's address (``https://127.0.0.1:<port>``)."""
        return self.plane.url

    def start(self) -> RealKube:
        """Start the control plane when this object owns it, and the node and pod informers."""
        if self._owns_plane:
            self.plane.start()
        with contextlib.suppress(FileNotFoundError):  # this run's requests start here
            self._audit_offset = self.plane.audit_log.stat().st_size
        selector = f"{RUN_LABEL}={self.run}"
        self._nodes = _Informer(self.plane, "nodes", selector)
        self._pods = _Informer(self.plane, "pods", selector)
        for informer in (self._nodes, self._pods):
            informer.start()
        for informer in (self._nodes, self._pods):
            if not informer.synced.wait(30):
                raise TimeoutError(f"the {informer.plural} informer did not sync in 30 s")
        return self

    def stop(self) -> None:
        """Cancel timers, stop the informers, delete this run's nodes and namespaces (without waiting for the
        namespaces to finish terminating), and stop the control plane when this object started it."""
        with self.lock:
            for timer in self._timers:
                timer.cancel()
        for informer in (self._nodes, self._pods):
            if informer is not None:
                informer.stop()
        if self.plane.port and not self._owns_plane:
            for name in sorted(self._namespaces):
                with contextlib.suppress(urllib.error.URLError, OSError):
                    self.plane.request("DELETE", f"/api/v1/namespaces/{name}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                self.plane.request(
                    "DELETE", f"/api/v1/nodes?labelSelector={urllib.parse.quote(f'{RUN_LABEL}={self.run}')}"
                )
        if self._owns_plane:
            self.plane.stop()

    def __enter__(self) -> RealKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, path: Path) -> Path:
        """Write an administrator's kubeconfig for the API server to ``path`` and return it."""
        path.write_text(self.plane.admin_kubeconfig.read_text())
        return path

    def service_account_kubeconfig(
        self,
        path: Path,
        *,
        namespace: str,
        name: str,
        cluster_rules: list[Obj],
        namespaced_rules: list[Obj] | None = None,
    ) -> Path:
        """A kubeconfig for the ServiceAccount ``namespace/name`` whose only rights are ``cluster_rules`` (a
        ClusterRole, RBAC ``rules`` items) and ``namespaced_rules`` (a Role in ``namespace``)."""
        self.grant(namespace, name, cluster_rules, namespaced_rules)
        return self.plane.service_account_kubeconfig(namespace, name, path)

    def service_account_token(
        self,
        *,
        namespace: str,
        name: str,
        cluster_rules: list[Obj],
        namespaced_rules: list[Obj] | None = None,
    ) -> str:
        """A bearer token for the ServiceAccount ``namespace/name``, granted as :meth:`service_account_kubeconfig`
        grants it: what a pod of that account finds in ``/var/run/secrets/kubernetes.io/serviceaccount/token``."""
        self.grant(namespace, name, cluster_rules, namespaced_rules)
        return self.plane.service_account_token(namespace, name)

    def grant(
        self, namespace: str, name: str, cluster_rules: list[Obj], namespaced_rules: list[Obj] | None
    ) -> None:
        """Bind the ServiceAccount ``namespace/name`` to a ClusterRole of ``cluster_rules`` and, when given, a
        Role of ``namespaced_rules`` in ``namespace`` (both labelled with this run, named after it)."""
        self.ensure_namespace(namespace)
        role_name = f"{name}-{self.run}"
        subject = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
        labels = {RUN_LABEL: self.run}
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        self._create(
            f"{rbac}/clusterroles",
            {"metadata": {"name": role_name, "labels": labels}, "rules": cluster_rules},
        )
        self._create(
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": role_name, "labels": labels},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role_name,
                },
                "subjects": subject,
            },
        )
        if namespaced_rules:
            self._create(
                f"{rbac}/namespaces/{namespace}/roles",
                {"metadata": {"name": name, "labels": labels}, "rules": namespaced_rules},
            )
            self._create(
                f"{rbac}/namespaces/{namespace}/rolebindings",
                {
                    "metadata": {"name": name, "labels": labels},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": subject,
                },
            )

    def inject_fault(self, *args: Any, **kwargs: Any) -> Any:
        """Not available on a real API server: raises ``NotImplementedError`` (fault injection is the
        emulation's)."""
        raise NotImplementedError("fault injection is a feature of the emulated API server only")

    # ------------------------------------------------------------------------------------- cluster state

    def _informer(self, plural: str) -> _Informer | None:
        return {"nodes": self._nodes, "pods": self._pods}.get(plural)

    def objects(self, plural: str) -> list[Obj]:
        """Copies of this run's nodes or pods (from the informer), or of every object of another resource in the
        cluster (listed)."""
        informer = self._informer(plural)
        if informer is not None:
            with informer.lock:
                return [copy.deepcopy(obj) for obj in informer.objects.values()]
        return list(self.plane.request("GET", PATHS[plural])["items"])

    def count(self, plural: str, predicate: Callable[[Obj], bool]) -> int:
        """How many of :meth:`objects` satisfy ``predicate`` (which must not modify them); no copies for nodes and
        pods."""
        informer = self._informer(plural)
        if informer is not None:
            with informer.lock:
                return sum(1 for obj in informer.objects.values() if predicate(obj))
        return sum(1 for obj in self.objects(plural) if predicate(obj))

    def get(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        """One object read from the API server (a quorum read), or ``None`` when it does not exist."""
        try:
            return dict(self.plane.request("GET", _object_path(plural, name, namespace)))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def pods_on(self, node: str) -> list[Obj]:
        """Copies of this run's pods bound to ``node`` (from the informer)."""
        assert self._pods is not None
        with self._pods.lock:
            return [
                copy.deepcopy(p)
                for p in self._pods.objects.values()
                if (p.get("spec") or {}).get("nodeName") == node
            ]

    # ------------------------------------------------------------------------------------- building

    def ensure_namespace(self, namespace: str) -> None:
        """Create ``namespace`` (labelled with the run) unless it exists, and wait for its default
        ServiceAccount (pods cannot be created before it)."""
        if namespace in self._namespaces or namespace in ("default", "kube-system"):
            return
        self._create("/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {RUN_LABEL: self.run}}})
        self._namespaces.add(namespace)
        self._until(
            lambda: self.get_raw(f"/api/v1/namespaces/{namespace}/serviceaccounts/default") is not None,
            f"the default ServiceAccount of {namespace}",
        )

    def add_node(
        self,
        name: str,
        *,
        provider_id: str = "",
        labels: dict[str, str] | None = None,
        register_after_s: float = 0.0,
        ready_after_s: float | None = 0.0,
    ) -> None:
        """Create a Node (``kubernetes.io/hostname`` = ``name``, the run label), now or ``register_after_s``
        simulated seconds from now; KWOK turns it Ready ``ready_after_s`` after it appears. With
        ``ready_after_s`` ``None`` KWOK does not manage it: registered, never Ready (no kubelet answers)."""
        body: Obj = {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, RUN_LABEL: self.run, **(labels or {})},
            },
            "spec": {"providerID": provider_id} if provider_id else {},
        }
        with self.lock:
            self._node_names.add(name)

        def register() -> None:
            annotations = {KWOK_NODE: "fake"} if ready_after_s is not None else {}
            if ready_after_s is not None and ready_after_s > 0:
                ready_at = datetime.now(UTC) + timedelta(seconds=self.clock.real(ready_after_s))
                annotations[READY_AT] = ready_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            body["metadata"]["annotations"] = annotations
            try:
                self._create("/api/v1/nodes", body)
            except RuntimeError as exc:  # a returning kubelet finds its Node registered: it keeps it
                if "HTTP 409" not in str(exc):
                    raise

        if register_after_s <= 0:
            register()
        else:
            self._later(register_after_s, register)

    def wait_for_nodes(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Block until every named Node exists, is Ready and has lost the ``node.kubernetes.io/not-ready`` taint
        (the node lifecycle controller removes it a few seconds after Ready: pods created before would all land on
        the first nodes it cleared); raises ``TimeoutError`` after ``timeout_s`` real seconds."""
        wanted = set(names)

        def ready() -> bool:
            assert self._nodes is not None
            with self._nodes.lock:
                return all(
                    (node := self._nodes.objects.get(("", name))) is not None
                    and _node_ready(node)
                    and not any(
                        t.get("key") in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
                        for t in (node.get("spec") or {}).get("taints") or []
                    )
                    for name in wanted
                )

        self._until(ready, f"{len(wanted)} nodes Ready", timeout_s)

    def delete_node(self, name: str) -> None:
        """Delete a Node and, as the cloud node lifecycle controller and the pod garbage collector would, every
        pod bound to it (at once)."""
        with contextlib.suppress(urllib.error.HTTPError):
            self.plane.request("DELETE", f"/api/v1/nodes/{name}")
        pods = self.plane.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}")["items"]
        for pod in pods:
            with contextlib.suppress(urllib.error.HTTPError):
                self.plane.request(
                    "DELETE",
                    _object_path("pods", pod["metadata"]["name"], pod["metadata"]["namespace"]),
                    {"gracePeriodSeconds": 0},
                )

    def _pod_spec(self, grace_s: int, empty_dir: bool, priority_class: str | None = None) -> Obj:
        spec: Obj = {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
            "terminationGracePeriodSeconds": self.clock.grace(grace_s),
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
        }
        if empty_dir:
            spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        if priority_class is not None:
            spec["priorityClassName"] = (
                priority_class  # the API server's Priority admission sets spec.priority
            )
        return spec

    def add_replicaset(
        self,
        namespace: str,
        name: str,
        *,
        nodes: list[str],
        replicas: int,
        labels: dict[str, str],
        grace_s: int = 30,
        empty_dir: bool = False,
        priority_class: str | None = None,
        wait: bool = True,
    ) -> list[str]:
        """A ReplicaSet of ``replicas`` pods spread over ``nodes`` by the scheduler; with ``wait``, returns when
        they are all Running and Ready, with their names. When ``nodes`` are not all of this run's nodes, the
        pods are first pinned to them and, once Ready, the pin is lifted from the template: replacements go to
        any schedulable node of the run, as in the emulation."""
        self.ensure_namespace(namespace)
        spec = self._pod_spec(grace_s, empty_dir, priority_class)
        spec["nodeSelector"] = {RUN_LABEL: self.run}
        pinned = set(nodes) != self._node_names
        if pinned:
            # one term per node (terms are ORed): a metadata.name field term takes one value
            terms = [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                for node in sorted(nodes)
            ]
            required = {"nodeSelectorTerms": terms}
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": dict(labels)},
            }
        ]
        pod_labels = {**labels, RUN_LABEL: self.run}
        path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
        self._create(
            path,
            {
                "metadata": {"name": name, "labels": pod_labels},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": dict(labels)},
                    "template": {"metadata": {"labels": pod_labels}, "spec": spec},
                },
            },
        )
        if not wait:  # the caller waits (wait_for_ready_pods); a pin stays
            return []
        self.wait_for_ready_pods(namespace, labels, replicas)
        if pinned:
            self._patch(f"{path}/{name}", {"spec": {"template": {"spec": {"affinity": None}}}})
        return sorted(
            p["metadata"]["name"]
            for p in self.objects("pods")
            if p["metadata"]["namespace"] == namespace and _labels_match(p, labels)
        )

    def add_deployment(
        self,
        namespace: str,
        name: str,
        *,
        replicas: int,
        labels: dict[str, str],
        grace_s: int = 30,
        annotations: dict[str, str] | None = None,
        node_labels: dict[str, str] | None = None,
        wait: bool = True,
        prefer_node: str | None = None,
        min_ready_s: int = 0,
    ) -> list[str]:
        """An apps/v1 Deployment of ``replicas`` pods (template ``annotations``) placed by the scheduler on this
        run's nodes (those with ``node_labels`` too, when given; ``prefer_node`` first, by a preferred node
        affinity on its hostname), available ``min_ready_s`` seconds after Ready (``minReadySeconds``); the
        Deployment and ReplicaSet controllers of kube-controller-manager run it (the emulation serves no
        Deployments). With ``wait``, returns when its pods are Ready, with their names."""
        self.ensure_namespace(namespace)
        spec = self._pod_spec(grace_s, False)
        spec["nodeSelector"] = {RUN_LABEL: self.run, **(node_labels or {})}
        if prefer_node is not None:
            term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer_node]}
            preferred = [{"weight": 100, "preference": {"matchExpressions": [term]}}]
            spec["affinity"] = {
                "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}
            }
        pod_labels = {**labels, RUN_LABEL: self.run}
        template: Obj = {"labels": pod_labels}
        if annotations:
            template["annotations"] = dict(annotations)
        self._create(
            f"/apis/apps/v1/namespaces/{namespace}/deployments",
            {
                "metadata": {"name": name, "labels": pod_labels},
                "spec": {
                    "replicas": replicas,
                    "minReadySeconds": min_ready_s,
                    "selector": {"matchLabels": dict(labels)},
                    "template": {"metadata": template, "spec": spec},
                },
            },
        )
        if not wait:
            return []
        self.wait_for_ready_pods(namespace, labels, replicas)
        return sorted(
            p["metadata"]["name"]
            for p in self.objects("pods")
            if p["metadata"]["namespace"] == namespace and _labels_match(p, labels) and _pod_ready(p)
        )

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Set a Deployment's ``spec.replicas`` as its owner does (a merge patch: ``kubectl scale``, a GitOps
        self-heal). Raises ``urllib.error.HTTPError`` when the API server refuses it."""
        self._patch(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}", {"spec": {"replicas": replicas}}
        )

    def track_ready(self, namespace: str, labels: dict[str, str]) -> ReadyReplicas:
        """Start counting the Ready pods of ``namespace`` with ``labels`` at every change (:class:`ReadyReplicas`)."""
        assert self._pods is not None, "start() first"
        return ReadyReplicas(self._pods, namespace, labels)

    def wait_for_ready_pods(self, namespace: str, labels: dict[str, str], count: int) -> None:
        """Block until ``count`` pods of ``namespace`` with ``labels`` are Running and Ready."""

        def enough() -> bool:
            assert self._pods is not None
            with self._pods.lock:
                return (
                    sum(
                        1
                        for p in self._pods.objects.values()
                        if p["metadata"]["namespace"] == namespace
                        and _labels_match(p, labels)
                        and _pod_ready(p)
                    )
                    >= count
                )

        self._until(enough, f"{count} Ready pods {labels} in {namespace}")

    def add_daemonset(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str],
        grace_s: int = 30,
        priority_class: str | None = None,
        wait: bool = True,
    ) -> None:
        """A DaemonSet with a pod on every node of this run, now and on nodes that appear later; with ``wait``,
        returns when the DaemonSet controller reports a Ready pod on every node it schedules to (nodes with a
        taint its pods do not tolerate get none, as on a real cluster)."""
        self.ensure_namespace(namespace)
        spec = self._pod_spec(grace_s, False, priority_class)
        spec["nodeSelector"] = {RUN_LABEL: self.run}
        pod_labels = {**labels, RUN_LABEL: self.run}
        self._create(
            f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
            {
                "metadata": {"name": name, "labels": pod_labels},
                "spec": {
                    "selector": {"matchLabels": dict(labels)},
                    "template": {"metadata": {"labels": pod_labels}, "spec": spec},
                },
            },
        )
        if wait:
            path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"

            def rolled_out() -> bool:
                ds = self.plane.request("GET", path)
                status = ds.get("status") or {}
                return bool(
                    status.get("observedGeneration", 0) >= ds["metadata"]["generation"]
                    and status.get("numberReady", 0) == status.get("desiredNumberScheduled", -1)
                )

            self._until(rolled_out, f"DaemonSet {namespace}/{name} Ready on every node")

    def add_pdb(
        self,
        namespace: str,
        name: str,
        *,
        match_labels: dict[str, str],
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
        unhealthy_pod_eviction_policy: str | None = None,
    ) -> None:
        """A policy/v1 PodDisruptionBudget selecting ``match_labels``; returns when the disruption controller has
        computed its status."""
        self.ensure_namespace(namespace)
        spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        if unhealthy_pod_eviction_policy is not None:
            spec["unhealthyPodEvictionPolicy"] = unhealthy_pod_eviction_policy
        self._create(
            f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
            {"metadata": {"name": name, "labels": {RUN_LABEL: self.run}}, "spec": spec},
        )
        self._wait_pdb_observed(namespace, name)

    def set_pdb(
        self,
        namespace: str,
        name: str,
        *,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> None:
        """Change a PodDisruptionBudget's minAvailable/maxUnavailable (exactly one of them is kept; an update
        with the read resourceVersion, retried on a conflict); returns when its status is computed."""
        path = _object_path("poddisruptionbudgets", name, namespace)
        for _ in range(10):
            pdb = self.plane.request("GET", path)
            spec = {k: v for k, v in pdb["spec"].items() if k not in ("minAvailable", "maxUnavailable")}
            if min_available is not None:
                spec["minAvailable"] = min_available
            if max_unavailable is not None:
                spec["maxUnavailable"] = max_unavailable
            pdb["spec"] = spec
            try:
                self.plane.request("PUT", path, pdb)
                break
            except urllib.error.HTTPError as exc:
                if exc.code != 409:
                    raise
        self._wait_pdb_observed(namespace, name)

    def _wait_pdb_observed(self, namespace: str, name: str) -> None:
        path = _object_path("poddisruptionbudgets", name, namespace)

        def observed() -> bool:
            pdb = self.plane.request("GET", path)
            return int((pdb.get("status") or {}).get("observedGeneration", 0)) >= int(
                pdb["metadata"]["generation"]
            )

        self._until(observed, f"PodDisruptionBudget {namespace}/{name} observed")

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        labels: dict[str, str] | None = None,
        grace_s: int = 30,
        empty_dir: bool = False,
        mirror: bool = False,
        phase: str = "Running",
        ready: bool = True,
        priority_class: str | None = None,
        annotations: dict[str, str] | None = None,
        wait: bool = True,
    ) -> None:
        """A pod bound to ``node`` without a controller (unreplicated), or a mirror (static) pod with ``mirror=True``
        (owned by its Node, as the kubelet makes them). ``phase`` other than Running, or not ``ready``: the pod's
        status is set by the sandbox (Succeeded/Failed: finished; Pending: not started; Running and not Ready),
        not by KWOK. ``annotations`` are added to its metadata. With ``wait``, returns once KWOK has made it Running and
        Ready."""
        self.ensure_namespace(namespace)
        metadata: Obj = {
            "name": name,
            "labels": {**(labels or {}), RUN_LABEL: self.run},
            "annotations": dict(annotations or {}),
        }
        if mirror:
            assert self._nodes is not None
            with self._nodes.lock:
                cached = self._nodes.objects.get(("", node))
            node_obj = cached or self.plane.request("GET", f"/api/v1/nodes/{node}")
            metadata["annotations"]["kubernetes.io/config.mirror"] = uuid.uuid4().hex
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    "uid": node_obj["metadata"]["uid"],
                    "controller": True,
                }
            ]
        manual = phase != "Running" or not ready
        if manual:
            metadata["annotations"][MANUAL_STATUS] = "manual"
        spec = {**self._pod_spec(grace_s, empty_dir, priority_class), "nodeName": node}
        self._create(f"/api/v1/namespaces/{namespace}/pods", {"metadata": metadata, "spec": spec})
        if manual:
            status: Obj = {"phase": phase, "conditions": [{"type": "Ready", "status": "False"}]}
            self._patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status})
            self._until(
                lambda: (self.get("pods", name, namespace) or {}).get("status", {}).get("phase") == phase,
                f"pod {namespace}/{name} {phase}",
            )
        elif wait:
            self.wait_for_ready_pods(namespace, {**(labels or {}), RUN_LABEL: self.run}, 1)

    # ------------------------------------------------------------------------------------- audit

    def _read_audit(self) -> None:
        """Fold the audit log's new events into the request counters and the eviction record."""
        events, self._audit_offset = self.plane.audit_events(self._audit_offset)
        for event in events:
            if event.get("stage") != "ResponseComplete":
                continue
            ref = event.get("objectRef") or {}
            user = (event.get("user") or {}).get("username", "")
            code = int((event.get("responseStatus") or {}).get("code", 0))
            resource = ref.get("resource", "")
            if not resource:
                continue
            described = f"{event['verb']} {resource}" + (
                f"/{ref['subresource']}" if ref.get("subresource") else ""
            )
            if not self._ours(user):
                continue
            self._by_user[(user, described, code)] += 1
            if user != self.admin_user:
                self._requests[described] += 1
            dry_run = "dryRun=All" in event.get("requestURI", "") or "All" in (
                ((event.get("requestObject") or {}).get("deleteOptions") or {}).get("dryRun") or []
            )
            if ref.get("subresource") == "eviction" and code == 201 and not dry_run:
                self._pending.append(
                    (
                        (ref.get("namespace", ""), ref.get("name", "")),
                        event["stageTimestamp"],
                        str(event.get("userAgent") or ""),
                    )
                )
        self._resolve_pending()

    def _resolve_pending(self) -> None:
        """Turn the evictions read from the audit log into the pods they evicted, as the informer last saw them;
        one the informer has not seen yet is waited for a moment (up to 1 s in all), then left for the next
        read."""
        deadline = time.monotonic() + 1.0
        while self._pending:
            key, stamp, agent = self._pending[0]
            if key[0] not in self._namespaces:  # not a pod of this run
                self._pending.popleft()
                continue
            assert self._pods is not None
            with self._pods.lock:
                pod = self._pods.objects.get(key) or self._pods.gone.get(key)
            if pod is None:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)
                continue
            self._pending.popleft()
            pod = eviction_record(pod, agent)
            self._evictions.append(pod)
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                self._last_eviction[node] = datetime.fromisoformat(stamp)
                self._first_eviction.setdefault(node, self._last_eviction[node])

    def _ours(self, user: str) -> bool:
        """Whether ``user`` acts for this run: the administrator, or a ServiceAccount of one of its namespaces."""
        if user == self.admin_user:
            return True
        parts = user.split(":")
        return len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and parts[2] in self._namespaces

    @property
    def requests(self) -> Counter[str]:
        """Requests served since :meth:`start` to the ServiceAccounts of this run's namespaces (the controller's), by
        ``"<verb> <resource>[/<subresource>]"`` (``list pods``, ``create pods/eviction``), from the audit log."""
        with self.lock:
            self._read_audit()
            return Counter(self._requests)

    def requests_by(self, user: str) -> Counter[tuple[str, int]]:
        """Requests of ``user`` (e.g. ``system:serviceaccount:ns:name``) by (``"<verb> <resource>"``, HTTP status
        code), from the audit log."""
        with self.lock:
            self._read_audit()
            return Counter({(what, code): n for (who, what, code), n in self._by_user.items() if who == user})

    def denied(self) -> Counter[tuple[str, str]]:
        """Requests of this run (its administrator and its ServiceAccounts) answered 403 Forbidden, by (user,
        ``"<verb> <resource>"``)."""
        with self.lock:
            self._read_audit()
            return Counter({(who, what): n for (who, what, code), n in self._by_user.items() if code == 403})

    @property
    def evictions(self) -> list[Obj]:
        """Every pod of this run an eviction deleted (HTTP 201), as last seen before it, in audit-log order."""
        with self.lock:
            self._read_audit()
            return list(self._evictions)

    @property
    def first_eviction(self) -> dict[str, datetime]:
        """Node name → time (aware UTC, the API server's) of the first eviction of a pod bound to it."""
        with self.lock:
            self._read_audit()
            return dict(self._first_eviction)

    @property
    def last_eviction(self) -> dict[str, datetime]:
        """Node name → time (aware UTC, the API server's) of the last eviction of a pod bound to it."""
        with self.lock:
            self._read_audit()
            return dict(self._last_eviction)

    # ------------------------------------------------------------------------------------- plumbing

    def get_raw(self, path: str) -> Obj | None:
        """GET an API path as the administrator; ``None`` on 404."""
        try:
            return dict(self.plane.request("GET", path))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _create(self, path: str, body: Obj) -> Obj:
        for attempt in range(20):
            try:
                return dict(self.plane.request("POST", path, body))
            except urllib.error.HTTPError as exc:
                message = exc.read().decode(errors="replace")
                # A namespace's default ServiceAccount may not exist yet, or an admission cache lags.
                if exc.code in (403, 409, 500) and "serviceaccount" in message.lower() and attempt < 19:
                    time.sleep(0.1)
                    continue
                raise RuntimeError(f"POST {path}: HTTP {exc.code}: {message[:300]}") from None
        raise AssertionError("unreachable")

    def _patch(self, path: str, body: Obj) -> None:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.plane.url}{path}",
            data=data,
            method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"},
        )
        with urllib.request.urlopen(request, context=self.plane.ssl_context(), timeout=30) as response:
            response.read()

    def _later(self, simulated_s: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(self.clock.real(simulated_s), action)
        timer.daemon = True
        with self.lock:
            self._timers.append(timer)
        timer.start()

    def _until(self, predicate: Callable[[], bool], what: str, timeout_s: float | None = None) -> None:
        timeout_s = timeout_s or self.wait_timeout_s
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while not predicate():
            if time.monotonic() > deadline:
                self.plane.check()
                raise TimeoutError(f"{what}: not reached in {timeout_s:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


def _labels_match(obj: Obj, labels: dict[str, str]) -> bool:
    have = obj["metadata"].get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _pod_ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return (
        not pod["metadata"].get("deletionTimestamp")
        and status.get("phase") == "Running"
        and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
    )


def _node_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
