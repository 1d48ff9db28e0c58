"""A Kubernetes API server emulation on 127.0.0.1, for the real ``kubernetes`` client.

What it serves (JSON over HTTP, the paths and shapes of the Kubernetes API reference):

- core/v1 ``nodes`` (with ``/status``), ``pods`` (cluster-wide and per namespace), ``events``;
  apps/v1 ``daemonsets``, ``replicasets``; policy/v1 ``poddisruptionbudgets`` and the ``pods/eviction``
  subresource; coordination.k8s.io/v1 ``leases``;
- get, list (label selectors; field selectors ``metadata.name``, ``metadata.namespace``, ``spec.nodeName``,
  ``status.phase`` for pods; ``resourceVersion=0`` served from a cache that lags by ``cache_lag_s``, as the
  API server's watch cache may), create, replace (``metadata.resourceVersion`` must match, else 409 Conflict),
  patch (strategic merge, JSON merge, JSON patch), delete;
- graceful pod deletion: a pod gets a ``deletionTimestamp`` and disappears when its grace period has passed
  (a simulated kubelet); a ReplicaSet replaces its terminating pods on a schedulable node, and a DaemonSet
  recreates a deleted pod on its node, as their controllers do;
- evictions with PodDisruptionBudget arithmetic: 429 when the budget allows no disruption, 500 when a pod
  matches more than one budget, 404 for a missing pod; a pending or terminating pod is evicted without a
  budget check ("API-initiated Eviction");
- nodes that register (and turn Ready) some time after their instance launched;
- every request counted by verb and resource (:attr:`KubeSandbox.requests`), and fault injection
  (:meth:`KubeSandbox.inject_fault`).

Not served: watches, deletecollection, admission, validation beyond what these behaviours need. Every duration
is simulated seconds turned into real ones by the :class:`~queue_processor.sandbox.clock.SandboxClock`.

The server runs an asyncio loop in a thread of its own, so synchronous clients (tests, the controller's thread
pool) and asynchronous ones can use it alike; its state is guarded by one lock.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import heapq
import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from queue_processor.sandbox.clock import SandboxClock
from queue_processor.sandbox.kube_logic import (
    ApiError,
    Obj,
    is_ready,
    is_terminating,
    json_patch,
    merge_patch,
    owner,
    parse_field_selector,
    parse_label_selector,
    pdb_expected,
    pdb_status,
    pdb_status_of,
    selector_matches,
    strategic_merge_patch,
)

__all__ = ["RESOURCES", "Fault", "KubeSandbox", "ResourceInfo"]


@dataclass(frozen=True)
class ResourceInfo:
    """A served resource: its API group/version (``v1``, ``apps/v1``…), kind, and whether it is namespaced."""

    group_version: str
    kind: str
    namespaced: bool


RESOURCES: dict[str, ResourceInfo] = {
    "namespaces": ResourceInfo("v1", "Namespace", False),
    "nodes": ResourceInfo("v1", "Node", False),
    "pods": ResourceInfo("v1", "Pod", True),
    "events": ResourceInfo("v1", "Event", True),
    "daemonsets": ResourceInfo("apps/v1", "DaemonSet", True),
    "replicasets": ResourceInfo("apps/v1", "ReplicaSet", True),
    "poddisruptionbudgets": ResourceInfo("policy/v1", "PodDisruptionBudget", True),
    "leases": ResourceInfo("coordination.k8s.io/v1", "Lease", True),
}

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


@dataclass
class Fault:
    """Answer the next ``count`` requests matching ``verb`` and ``resource`` (``None`` = any) with HTTP
    ``status`` (e.g. 429, 500), or, when ``status`` is ``None``, hold each for ``delay_s`` real seconds first
    (a slow or timing-out API server). ``retry_after_s`` sets the Retry-After header of a 429."""

    verb: str | None
    resource: str | None
    status: int | None
    count: int
    delay_s: float = 0.0
    retry_after_s: int | None = None


@dataclass(order=True)
class _Timer:
    at: float
    seq: int
    action: str = field(compare=False)
    key: Key = field(compare=False)
    payload: Any = field(compare=False, default=None)


def _qualified(plural: str) -> str:
    """``pods``, ``leases.coordination.k8s.io``: how the API server names a resource in its error messages."""
    group = RESOURCES[plural].group_version.rpartition("/")[0]
    return f"{plural}.{group}" if group else plural


def _details(plural: str) -> dict[str, str]:
    """The ``group`` (omitted for the core group) and ``kind`` (the plural) of a Status's details."""
    group = RESOURCES[plural].group_version.rpartition("/")[0]
    return {"group": group, "kind": plural} if group else {"kind": plural}


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeSandbox:
    """The emulated API server. Use as a context manager or call :meth:`start`/:meth:`stop`.

    ``clock`` scales every simulated duration; ``cache_lag_s`` (simulated seconds) is how stale a
    ``resourceVersion=0`` list may be; ``pod_start_s`` how long a replacement pod takes to become Ready.
    """

    def __init__(
        self,
        clock: SandboxClock | None = None,
        *,
        cache_lag_s: float = 1.0,
        pod_start_s: float = 2.0,
        tick_s: float = 0.01,
    ) -> None:
        self.clock = clock or SandboxClock()
        self.cache_lag_s = cache_lag_s
        self.pod_start_s = pod_start_s
        self.tick_s = tick_s
        self.lock = threading.RLock()
        self.requests: Counter[str] = Counter()
        """Requests served, by ``"<verb> <resource>[/<subresource>]"`` (``list pods``, ``create pods/eviction``)."""
        self.evictions: list[Obj] = []
        """Every pod an eviction deleted, as it was just before (tests check which pods were evicted)."""
        self.last_eviction: dict[str, datetime] = {}
        """Node name → wall-clock time (aware UTC) of the last eviction of a pod bound to it."""
        self._objects: dict[str, dict[Key, Obj]] = {plural: {} for plural in RESOURCES}
        self._pods_by_node: dict[str, set[Key]] = {}
        # (namespace, label, value) → pods: PodDisruptionBudgets and ReplicaSets select through it, so an
        # eviction costs the size of its selection, not of the cluster.
        self._pods_by_label: dict[tuple[str, str, str], set[Key]] = {}
        self._active_by_owner: dict[str, set[Key]] = {}  # controller uid -> its pods not being deleted
        # Per label (namespace, key, value): ready pods, and pods not being deleted by controller reference
        # (kind, name, uid; None for none): a one-label PodDisruptionBudget's status without a scan.
        self._label_ready: dict[tuple[str, str, str], int] = {}
        self._label_owners: dict[tuple[str, str, str], dict[tuple[str, str, str] | None, int]] = {}
        self._writes: Counter[str] = Counter()  # stores and removals by resource, to know when to recompute
        self._schedulable: tuple[int, list[str]] = (-1, [])
        self._rv = 0
        self._snapshot: dict[str, dict[Key, Obj]] = {}
        self._snapshot_by_node: dict[str, list[Key]] = {}
        self._snapshot_at = -1e18
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        self._faults: list[Fault] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self.port = 0
        for namespace in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.ensure_namespace(namespace)

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, the API server's address."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> KubeSandbox:
        """Start serving on a free port; returns when the server accepts connections."""
        started = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(started))
            except BaseException as exc:  # surfaced to start()'s caller
                errors.append(exc)
                started.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="kube-sandbox", daemon=True)
        self._thread.start()
        started.wait(10)
        if errors:
            raise RuntimeError("the Kubernetes sandbox did not start") from errors[0]
        return self

    def stop(self) -> None:
        """Stop serving and join the server thread."""
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None

    def __enter__(self) -> KubeSandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self, started: threading.Event) -> None:
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/version", self._version)
        app.router.add_get("/api", self._discovery)
        app.router.add_get("/apis", self._discovery)
        app.router.add_get("/api/v1", self._discovery)
        app.router.add_get("/apis/{group}/{version}", self._discovery)
        app.router.add_route("*", "/api/{tail:.*}", self._handle)
        app.router.add_route("*", "/apis/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        started.set()
        ticker = asyncio.create_task(self._tick_forever())
        try:
            await self._stopping.wait()
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            await self._runner.cleanup()

    # ---------------------------------------------------------------------------------- client helpers

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig for this server to ``path`` (context ``sandbox``) and return it."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "sandbox", "user": {"token": "sandbox"}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "sandbox"}}],
            "current-context": "sandbox",
        }
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return path

    def inject_fault(
        self,
        verb: str | None,
        resource: str | None,
        *,
        status: int | None = None,
        count: int = 1,
        delay_s: float = 0.0,
        retry_after_s: int | None = None,
    ) -> Fault:
        """Add a :class:`Fault`; returns it (its ``count`` drops as requests consume it)."""
        fault = Fault(verb, resource, status, count, delay_s, retry_after_s)
        with self.lock:
            self._faults.append(fault)
        return fault

    # ------------------------------------------------------------------------------------- cluster state

    def objects(self, plural: str) -> list[Obj]:
        """Copies of every stored object of a resource (the current state, never the cache)."""
        with self.lock:
            return [copy.deepcopy(obj) for obj in self._objects[plural].values()]

    def count(self, plural: str, predicate: Callable[[Obj], bool]) -> int:
        """How many stored objects of a resource satisfy ``predicate`` (which must not modify them); no
        copies, so cheap enough to sample every second during a storm."""
        with self.lock:
            return sum(1 for obj in self._objects[plural].values() if predicate(obj))

    def get(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        """A copy of one stored object, or ``None``."""
        with self.lock:
            obj = self._objects[plural].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def pods_on(self, node: str) -> list[Obj]:
        """Copies of the pods bound to ``node``."""
        with self.lock:
            return [copy.deepcopy(self._objects["pods"][key]) for key in self._pods_by_node.get(node, ())]

    def ensure_namespace(self, namespace: str) -> None:
        """Create ``namespace`` unless it exists (the helpers below do it for the namespaces they use; a request
        through the API into a missing namespace is answered 404, as the API server does)."""
        with self.lock:
            if ("", namespace) not in self._objects["namespaces"]:
                self._insert(
                    "namespaces",
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": namespace},
                        "status": {"phase": "Active"},
                    },
                )

    def add_node(
        self,
        name: str,
        *,
        provider_id: str = "",
        labels: dict[str, str] | None = None,
        register_after_s: float = 0.0,
        ready_after_s: float = 0.0,
    ) -> None:
        """Add a Node (``kubernetes.io/hostname`` label = ``name``). With ``register_after_s`` it appears that
        many simulated seconds from now; it turns Ready ``ready_after_s`` after it appears. DaemonSets get a
        pod on it when it appears."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"providerID": provider_id} if provider_id else {},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]},
        }
        with self.lock:
            self._schedule(register_after_s, "register-node", ("", name), (node, ready_after_s))

    def wait_for_nodes(self, names: list[str], timeout_s: float = 30.0) -> None:
        """Block until every named Node exists and is Ready; raises ``TimeoutError`` after ``timeout_s`` real
        seconds."""
        deadline = time.monotonic() + timeout_s
        wanted = set(names)
        while True:
            with self.lock:
                ready = {
                    name
                    for name in wanted
                    if (node := self._objects["nodes"].get(("", name))) is not None
                    and any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in node["status"]["conditions"]
                    )
                }
            if ready == wanted:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(wanted - ready)} of {len(wanted)} nodes not Ready after {timeout_s} s"
                )
            time.sleep(0.005)

    def delete_node(self, name: str) -> None:
        """Remove a Node and every pod bound to it (the cloud node controller and pod GC do this when the
        instance is gone)."""
        with self.lock:
            self._remove("nodes", ("", name))  # first, so that no DaemonSet puts a pod back on it
            for key in list(self._pods_by_node.get(name, ())):
                self._remove("pods", key)

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
        wait: bool = True,
    ) -> list[str]:
        """A ReplicaSet of ``replicas`` Ready pods placed round-robin on ``nodes``; returns the pod names (they are
        Ready at once: ``wait`` is accepted for the real backend's sake)."""
        rs = self._store_new(
            "replicasets",
            {
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)}},
                "status": {"replicas": replicas},
            },
        )
        template = self._pod_template(labels, grace_s, empty_dir)
        names = []
        for index in range(replicas):
            pod_name = f"{name}-{index:05d}"
            pod = self._pod(namespace, pod_name, nodes[index % len(nodes)], template, rs)
            names.append(pod_name)
            with self.lock:
                self._insert("pods", pod)
        return names

    def add_daemonset(
        self, namespace: str, name: str, *, labels: dict[str, str], grace_s: int = 30, wait: bool = True
    ) -> None:
        """A DaemonSet with one Ready pod on every node, now and on nodes that appear later (at once: ``wait`` is
        accepted for the real backend's sake)."""
        ds = self._store_new(
            "daemonsets",
            {
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "spec": {
                    "selector": {"matchLabels": dict(labels)},
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": self._pod_template(labels, grace_s)["spec"],
                    },
                },
            },
        )
        with self.lock:
            for node in list(self._objects["nodes"].values()):
                self._daemon_pod(ds, node["metadata"]["name"])

    def wait_for_ready_pods(self, namespace: str, labels: dict[str, str], count: int) -> None:
        """Nothing to wait for: the emulation's pods are Ready when they are added."""

    def add_pdb(
        self,
        namespace: str,
        name: str,
        *,
        match_labels: dict[str, str],
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> None:
        """A policy/v1 PodDisruptionBudget selecting ``match_labels``."""
        spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        self._store_new(
            "poddisruptionbudgets", {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
        )

    def set_pdb(
        self,
        namespace: str,
        name: str,
        *,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> None:
        """Change a PodDisruptionBudget's minAvailable/maxUnavailable (exactly one of them is kept). Raises
        ``KeyError`` when it does not exist."""
        with self.lock:
            key = (namespace, name)
            pdb = copy.deepcopy(self._objects["poddisruptionbudgets"][key])
            spec = {k: v for k, v in pdb["spec"].items() if k not in ("minAvailable", "maxUnavailable")}
            if min_available is not None:
                spec["minAvailable"] = min_available
            if max_unavailable is not None:
                spec["maxUnavailable"] = max_unavailable
            pdb["spec"] = spec
            self._replace("poddisruptionbudgets", key, pdb)

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
        wait: bool = True,
    ) -> None:
        """A pod without a controller (unreplicated), or a mirror (static) pod with ``mirror=True``; in
        ``phase``, and Ready when Running and ``ready`` (at once: ``wait`` is for the real backend)."""
        template = self._pod_template(labels or {}, grace_s, empty_dir)
        pod = self._pod(namespace, name, node, template, None, phase=phase)
        if not ready:
            pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        if mirror:
            pod["metadata"]["annotations"] = {"kubernetes.io/config.mirror": uuid.uuid4().hex}
            pod["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node, "controller": True}
            ]
        with self.lock:
            self._insert("pods", pod)

    # ----------------------------------------------------------------------------------- object helpers

    def _pod_template(self, labels: dict[str, str], grace_s: int, empty_dir: bool = False) -> Obj:
        spec: Obj = {
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "terminationGracePeriodSeconds": grace_s,
        }
        if empty_dir:
            spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        return {"labels": dict(labels), "spec": spec}

    def _pod(
        self,
        namespace: str,
        name: str,
        node: str,
        template: Obj,
        controller: Obj | None,
        phase: str = "Running",
    ) -> Obj:
        metadata: Obj = {"name": name, "namespace": namespace, "labels": dict(template["labels"])}
        if controller is not None:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": RESOURCES[
                        "replicasets" if controller["kind"] == "ReplicaSet" else "daemonsets"
                    ].group_version,
                    "kind": controller["kind"],
                    "name": controller["metadata"]["name"],
                    "uid": controller["metadata"]["uid"],
                    "controller": True,
                }
            ]
        ready = "True" if phase == "Running" else "False"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {**copy.deepcopy(template["spec"]), "nodeName": node},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
        }

    def _store_new(self, plural: str, obj: Obj) -> Obj:
        info = RESOURCES[plural]
        with self.lock:
            return self._insert(plural, {"apiVersion": info.group_version, "kind": info.kind, **obj})

    def _key(self, obj: Obj) -> Key:
        return (
            obj["metadata"].get("namespace", "") if RESOURCES[self._plural_of(obj)].namespaced else "",
            obj["metadata"]["name"],
        )

    @staticmethod
    def _plural_of(obj: Obj) -> str:
        return next(plural for plural, info in RESOURCES.items() if info.kind == obj["kind"])

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _insert(self, plural: str, obj: Obj) -> Obj:
        """Store a new object (lock held); raises 409 AlreadyExists when its name is taken."""
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        namespace = metadata.get("namespace", "") if RESOURCES[plural].namespaced else ""
        if RESOURCES[plural].namespaced:
            metadata["namespace"] = namespace or "default"
            namespace = metadata["namespace"]
            self.ensure_namespace(namespace)
        key = (namespace, metadata["name"])
        if key in self._objects[plural]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{_qualified(plural)} "{metadata["name"]}" already exists',
                {"name": metadata["name"], **_details(plural)},
            )
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", _now_iso())
        metadata["generation"] = 1
        metadata["resourceVersion"] = self._next_rv()
        self._objects[plural][key] = obj
        self._stored(plural, key, None, obj)
        return obj

    def _replace(self, plural: str, key: Key, obj: Obj) -> Obj:
        """Store a new version of an existing object (lock held); copy-on-write, so cache snapshots stay
        consistent."""
        old = self._objects[plural][key]
        obj["metadata"]["resourceVersion"] = self._next_rv()
        if obj.get("spec") != old.get("spec"):
            obj["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        self._objects[plural][key] = obj
        self._stored(plural, key, old, obj)
        return obj

    def _remove(self, plural: str, key: Key) -> Obj | None:
        obj = self._objects[plural].pop(key, None)
        if obj is not None:
            self._rv += 1
            self._stored(plural, key, obj, None)
            if plural == "pods":
                self._after_pod_gone(obj)
        return obj

    def _stored(self, plural: str, key: Key, old: Obj | None, new: Obj | None) -> None:
        """Bookkeeping after an object was stored, replaced (both given) or removed (``new`` None)."""
        self._writes[plural] += 1
        if plural == "pods":
            self._index_pod(key, old, new)

    def _index_pod(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        for pod, step in ((old, -1), (new, 1)):
            if pod is None:
                continue
            ready = is_ready(pod)
            terminating = is_terminating(pod)
            reference = owner(pod)
            by = (reference["kind"], reference["name"], reference["uid"]) if reference else None
            for label in (pod["metadata"].get("labels") or {}).items():
                index = (key[0], *label)
                if ready:
                    self._label_ready[index] = self._label_ready.get(index, 0) + step
                if not terminating:
                    owners = self._label_owners.setdefault(index, {})
                    owners[by] = owners.get(by, 0) + step
                    if not owners[by]:
                        del owners[by]
        for pod, add in ((old, False), (new, True)):
            if pod is None or is_terminating(pod):
                continue
            uid = (owner(pod) or {}).get("uid")
            if uid:
                members = self._active_by_owner.setdefault(uid, set())
                if add:
                    members.add(key)
                else:
                    members.discard(key)
        # Unscheduled pods are indexed under "" (the scheduler's queue).
        old_node = (old.get("spec") or {}).get("nodeName") or "" if old else None
        new_node = (new.get("spec") or {}).get("nodeName") or "" if new else None
        if old_node is not None and old_node != new_node:
            self._pods_by_node.get(old_node, set()).discard(key)
        if new_node is not None:
            self._pods_by_node.setdefault(new_node, set()).add(key)
        old_labels = (old["metadata"].get("labels") or {}) if old else {}
        new_labels = (new["metadata"].get("labels") or {}) if new else {}
        if old_labels != new_labels:
            for label, value in old_labels.items():
                self._pods_by_label.get((key[0], label, value), set()).discard(key)
            for label, value in new_labels.items():
                self._pods_by_label.setdefault((key[0], label, value), set()).add(key)

    def _select_pods(self, namespace: str, selector: Obj | None) -> list[Obj]:
        """The pods of ``namespace`` that a LabelSelector object selects (through the label index when it
        has matchLabels)."""
        match_labels = (selector or {}).get("matchLabels") or {}
        if match_labels:
            keys = set.intersection(
                *(
                    self._pods_by_label.get((namespace, label, value), set())
                    for label, value in match_labels.items()
                )
            )
            candidates = [self._objects["pods"][key] for key in keys]
        else:
            candidates = [
                p for p in self._objects["pods"].values() if p["metadata"].get("namespace") == namespace
            ]
        return [p for p in candidates if selector_matches(selector, p["metadata"].get("labels") or {})]

    def _schedule(self, delay_s: float, action: str, key: Key, payload: Any = None) -> None:
        at = self.clock.monotonic() + self.clock.real(delay_s)
        heapq.heappush(self._timers, _Timer(at, next(self._seq), action, key, payload))

    # ------------------------------------------------------------------------------ simulated controllers

    async def _tick_forever(self) -> None:
        while True:
            with self.lock:
                self._run_due_timers()
            await asyncio.sleep(self.tick_s)

    def _run_due_timers(self) -> None:
        now = self.clock.monotonic()
        while self._timers and self._timers[0].at <= now:
            timer = heapq.heappop(self._timers)
            if timer.action == "remove-pod":
                pod = self._objects["pods"].get(timer.key)
                if pod is not None and pod["metadata"].get("uid") == timer.payload:
                    self._remove("pods", timer.key)
            elif timer.action == "pod-ready":
                pod = self._objects["pods"].get(timer.key)
                if pod is not None and not is_terminating(pod):
                    ready = copy.deepcopy(pod)
                    ready["status"] = {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    }
                    self._replace("pods", timer.key, ready)
            elif timer.action == "register-node":
                node, ready_after_s = timer.payload
                if timer.key not in self._objects["nodes"]:
                    self._insert("nodes", node)
                    for ds in list(self._objects["daemonsets"].values()):
                        self._daemon_pod(ds, node["metadata"]["name"])
                self._schedule(ready_after_s, "node-ready", timer.key)
            elif timer.action == "node-ready":
                node = self._objects["nodes"].get(timer.key)
                if node is not None:
                    ready = copy.deepcopy(node)
                    ready["status"]["conditions"] = [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"}
                    ]
                    self._replace("nodes", timer.key, ready)
            elif timer.action == "schedule-pending":
                self._schedule_pending()

    def _daemon_pod(self, ds: Obj, node: str) -> None:
        name = f"{ds['metadata']['name']}-{node}"[:253]
        key = (ds["metadata"]["namespace"], name)
        if key in self._objects["pods"]:
            return
        template = ds["spec"]["template"]
        pod = self._pod(
            ds["metadata"]["namespace"],
            name,
            node,
            {"labels": template["metadata"]["labels"], "spec": template["spec"]},
            ds,
        )
        self._insert("pods", pod)

    def _after_pod_gone(self, pod: Obj) -> None:
        """A pod was removed: a DaemonSet recreates its pod on a node that is still there."""
        reference = owner(pod)
        if reference and reference["kind"] == "DaemonSet":
            ds = self._objects["daemonsets"].get((pod["metadata"]["namespace"], reference["name"]))
            node = pod["spec"].get("nodeName")
            if ds is not None and node and ("", node) in self._objects["nodes"]:
                self._daemon_pod(ds, node)

    def _start_terminating(self, key: Key, grace_s: int | None) -> Obj:
        """Begin the graceful deletion of a pod (lock held): set deletionTimestamp, remove it after the grace
        period (the pod's own when ``grace_s`` is None), and let its ReplicaSet replace it."""
        pod = self._objects["pods"][key]
        own_grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        grace = own_grace if grace_s is None or grace_s < 0 else grace_s
        if is_terminating(pod):
            current = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            if grace >= current:
                return pod
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if grace == 0 or finished or not pod["spec"].get("nodeName"):  # nothing runs it: gone at once
            removed = self._remove("pods", key) or pod
            self._replace_for_rs(removed)
            return removed
        terminating = copy.deepcopy(pod)
        terminating["metadata"]["deletionTimestamp"] = (
            datetime.now(UTC) + timedelta(seconds=grace)
        ).strftime("%Y-%m-%dT%H:%M:%SZ")
        terminating["metadata"]["deletionGracePeriodSeconds"] = grace
        terminating = self._replace("pods", key, terminating)
        self._schedule(grace, "remove-pod", key, pod["metadata"]["uid"])
        if not is_terminating(pod):
            self._replace_for_rs(terminating)
        return terminating

    def _replace_for_rs(self, pod: Obj) -> None:
        """The ReplicaSet controller: a terminating or removed pod of a ReplicaSet gets a replacement."""
        reference = owner(pod)
        if not reference or reference["kind"] != "ReplicaSet":
            return
        namespace = pod["metadata"]["namespace"]
        rs = self._objects["replicasets"].get((namespace, reference["name"]))
        if rs is None:
            return
        active = len(self._active_by_owner.get(rs["metadata"]["uid"], ()))
        for _ in range(int(rs["spec"].get("replicas", 0)) - active):
            template = {
                "labels": rs["spec"]["selector"]["matchLabels"],
                "spec": self._pod_template({}, int(pod["spec"].get("terminationGracePeriodSeconds", 30)))[
                    "spec"
                ],
            }
            replacement = self._pod(
                namespace,
                f"{rs['metadata']['name']}-{uuid.uuid4().hex[:5]}",
                "",
                template,
                rs,
                phase="Pending",
            )
            replacement["spec"].pop("nodeName", None)
            self._insert("pods", replacement)
        self._schedule_pending()

    def _schedulable_nodes(self) -> list[str]:
        """Names of the Ready, schedulable, untainted nodes (recomputed only after a node changed)."""
        if self._schedulable[0] == self._writes["nodes"]:
            return self._schedulable[1]
        nodes = []
        for node in self._objects["nodes"].values():
            spec, status = node.get("spec") or {}, node.get("status") or {}
            if spec.get("unschedulable"):
                continue
            if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or []):
                continue
            if any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
            ):
                nodes.append(node["metadata"]["name"])
        self._schedulable = (self._writes["nodes"], nodes)
        return nodes

    def _schedule_pending(self) -> None:
        """The scheduler: bind unscheduled pods to the schedulable node with the fewest pods; they turn
        Ready ``pod_start_s`` later. Pods with nowhere to go are retried every simulated second."""
        pending = list(self._pods_by_node.get("", ()))
        if not pending:
            return
        nodes = self._schedulable_nodes()
        if not nodes:
            self._schedule(1.0, "schedule-pending", ("", ""))
            return
        for key in pending:
            node = min(nodes, key=lambda name: len(self._pods_by_node.get(name, ())))
            bound = copy.deepcopy(self._objects["pods"][key])
            bound["spec"]["nodeName"] = node
            self._replace("pods", key, bound)
            self._schedule(self.pod_start_s, "pod-ready", key)

    # -------------------------------------------------------------------------------------------- HTTP

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"major": "1", "minor": "31", "gitVersion": "v1.31.0-queue-processor-sandbox"}
        )

    async def _discovery(self, request: web.Request) -> web.Response:
        """Discovery documents (``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``), so that kubectl
        and other discovery-based clients can talk to the emulation."""
        path = request.path.rstrip("/")
        groups: dict[str, list[str]] = {}
        for info in RESOURCES.values():
            if "/" in info.group_version:
                group, version = info.group_version.split("/")
                if version not in groups.setdefault(group, []):
                    groups[group].append(version)
        if path == "/api":
            body: Obj = {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
            return web.json_response(body)
        if path == "/apis":
            body = {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": group,
                        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                        "preferredVersion": {
                            "groupVersion": f"{group}/{versions[0]}",
                            "version": versions[0],
                        },
                    }
                    for group, versions in sorted(groups.items())
                ],
            }
            return web.json_response(body)
        group_version = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
        resources = []
        for plural, info in RESOURCES.items():
            if info.group_version != group_version:
                continue
            verbs = ["create", "delete", "get", "list", "patch", "update"]
            resources.append(
                {
                    "name": plural,
                    "singularName": info.kind.lower(),
                    "namespaced": info.namespaced,
                    "kind": info.kind,
                    "verbs": verbs,
                }
            )
            if plural in ("nodes", "pods"):
                resources.append(
                    {
                        "name": f"{plural}/status",
                        "singularName": "",
                        "namespaced": info.namespaced,
                        "kind": info.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if plural == "pods":
                resources.append(
                    {
                        "name": "pods/eviction",
                        "singularName": "",
                        "namespaced": True,
                        "group": "policy",
                        "version": "v1",
                        "kind": "Eviction",
                        "verbs": ["create"],
                    }
                )
        if not resources:
            error = ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return web.json_response(error.status(), status=404)
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            }
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            route = self._route(request.path)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)
        plural, namespace, name, sub = route
        verb = self._verb(request.method, name, request.query)
        resource = plural + (f"/{sub}" if sub else "")
        with self.lock:
            self.requests[f"{verb} {resource}"] += 1
            fault = self._take_fault(verb, resource)
        if fault is not None:
            if fault.status is None:
                await asyncio.sleep(fault.delay_s)
            else:
                error = ApiError(
                    fault.status,
                    "TooManyRequests" if fault.status == 429 else "InternalError",
                    "injected fault",
                )
                headers = (
                    {"Retry-After": str(fault.retry_after_s)} if fault.retry_after_s is not None else None
                )
                return web.json_response(error.status(), status=fault.status, headers=headers)
        try:
            body = await request.json() if request.can_read_body else None
            with self.lock:
                status, payload = self._dispatch(verb, plural, namespace, name, sub, request, body)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)
        except json.JSONDecodeError as exc:
            error = ApiError(400, "BadRequest", f"invalid JSON body: {exc}")
            return web.json_response(error.status(), status=400)
        return web.Response(status=status, body=json.dumps(payload), content_type="application/json")

    def _take_fault(self, verb: str, resource: str) -> Fault | None:
        for fault in self._faults:
            if (
                fault.count > 0
                and fault.verb in (None, verb)
                and fault.resource in (None, resource, resource.split("/")[0])
            ):
                fault.count -= 1
                return fault
        return None

    @staticmethod
    def _verb(method: str, name: str | None, query: Any) -> str:
        if method == "GET":
            if name is None:
                return "watch" if query.get("watch") in ("true", "1") else "list"
            return "get"
        return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, method.lower()
        )

    @staticmethod
    def _route(path: str) -> tuple[str, str, str | None, str | None]:
        """``(plural, namespace, name, subresource)`` of an API path; raises 404 for one not served."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            gv, rest = "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in RESOURCES or RESOURCES[rest[0]].group_version != gv:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return plural, namespace, name, sub

    def _dispatch(
        self,
        verb: str,
        plural: str,
        namespace: str,
        name: str | None,
        sub: str | None,
        request: web.Request,
        body: Any,
    ) -> tuple[int, Obj]:
        info = RESOURCES[plural]
        if info.namespaced and name is not None and not namespace:
            raise ApiError(404, "NotFound", f"{plural} must be addressed in a namespace")
        key: Key = (namespace if info.namespaced else "", name or "")
        if verb in ("create", "update"):
            self._check_types(plural, body)
        if verb == "list":
            return 200, self._list(plural, namespace, request.query)
        if verb == "watch":
            raise ApiError(405, "MethodNotAllowed", "watch is not served by the sandbox; list instead")
        if verb == "create" and name is None:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body must be an object")
            obj = copy.deepcopy(body)
            obj.setdefault("apiVersion", info.group_version)
            obj.setdefault("kind", info.kind)
            metadata = obj.setdefault("metadata", {})
            if not metadata.get("name") and not metadata.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{info.kind} "" is invalid: metadata.name: Required value: name or generateName is required',
                    {
                        "kind": info.kind,
                        "causes": [{"reason": "FieldValueRequired", "field": "metadata.name"}],
                    },
                )
            if info.namespaced:
                metadata["namespace"] = namespace or metadata.get("namespace") or "default"
                if ("", metadata["namespace"]) not in self._objects["namespaces"]:
                    raise ApiError(
                        404,
                        "NotFound",
                        f'namespaces "{metadata["namespace"]}" not found',
                        {"name": metadata["namespace"], "kind": "namespaces"},
                    )
            if plural == "events":
                self._validate_event(obj)
            return 201, self._present(plural, self._insert(plural, obj))
        if verb == "create" and plural == "pods" and sub == "eviction":
            return 201, self._evict(key, body or {}, dry_run=request.query.get("dryRun") == "All")
        current = self._objects[plural].get(key)
        if current is None:
            raise ApiError(
                404,
                "NotFound",
                f'{_qualified(plural)} "{name}" not found',
                {"name": name, **_details(plural)},
            )
        if verb == "get":
            return 200, self._present(plural, current)
        if verb == "delete":
            return 200, self._delete(plural, key, request.query, body)
        if verb == "update":
            return 200, self._update(plural, key, current, body, sub)
        if verb == "patch":
            return 200, self._patch(plural, key, current, body, request.content_type, sub)
        raise ApiError(405, "MethodNotAllowed", f"{verb} is not served for {plural}")

    @staticmethod
    def _validate_event(event: Obj) -> None:
        """core/v1 Event validation: an Event about a cluster-scoped object (a Node) lives in ``default``."""
        involved = event.get("involvedObject") or {}
        namespace = event["metadata"].get("namespace", "")
        if not involved.get("namespace") and namespace not in ("", "default"):
            raise ApiError(
                422,
                "Invalid",
                f'Event "{event["metadata"].get("name", "")}" is invalid: involvedObject.namespace: Invalid value: "": '
                "does not match event.namespace",
                {
                    "kind": "Event",
                    "causes": [{"reason": "FieldValueInvalid", "field": "involvedObject.namespace"}],
                },
            )
        if involved.get("namespace") and involved["namespace"] != namespace:
            raise ApiError(
                422,
                "Invalid",
                f'Event "{event["metadata"].get("name", "")}" is invalid: involvedObject.namespace: Invalid value: '
                f'"{involved["namespace"]}": does not match event.namespace',
                {
                    "kind": "Event",
                    "causes": [{"reason": "FieldValueInvalid", "field": "involvedObject.namespace"}],
                },
            )

    @staticmethod
    def _check_types(plural: str, obj: Any) -> None:
        """Decoding as the API server does for the typed fields the controller writes: a Lease's
        ``leaseDurationSeconds`` and ``leaseTransitions`` are int32 (a float is a 400, as Go's JSON decoder says)."""
        if plural != "leases" or not isinstance(obj, dict):
            return
        for name in ("leaseDurationSeconds", "leaseTransitions"):
            value = (obj.get("spec") or {}).get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ApiError(
                    400,
                    "BadRequest",
                    f'Lease in version "v1" cannot be handled as a Lease: json: cannot unmarshal '
                    f"{type(value).__name__} {value} into Go struct field LeaseSpec.spec.{name} of type int32",
                )

    def _present(self, plural: str, obj: Obj) -> Obj:
        if plural == "poddisruptionbudgets":
            obj = {**obj, "status": self._pdb_status(obj)}
        return obj

    def _list(self, plural: str, namespace: str, query: Any) -> Obj:
        stale = query.get("resourceVersion") == "0"
        objects, by_node = self._objects[plural], self._pods_by_node
        if stale:
            now = self.clock.monotonic()
            if now - self._snapshot_at > self.clock.real(self.cache_lag_s):
                self._snapshot = {p: dict(objs) for p, objs in self._objects.items()}
                self._snapshot_by_node = {node: list(keys) for node, keys in self._pods_by_node.items()}
                self._snapshot_at = now
            objects = self._snapshot.get(plural, {})
        keep_labels = parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
        keep_fields, equals = (
            parse_field_selector(plural, query["fieldSelector"]) if query.get("fieldSelector") else (None, {})
        )
        if plural == "pods" and "spec.nodeName" in equals and equals["spec.nodeName"]:
            index = self._snapshot_by_node if stale else by_node
            candidates: Iterator[Obj] = (
                objects[k] for k in index.get(equals["spec.nodeName"], ()) if k in objects
            )
        else:
            candidates = iter(objects.values())
        items = []
        for obj in candidates:
            if namespace and obj["metadata"].get("namespace") != namespace:
                continue
            if keep_labels is not None and not keep_labels(obj["metadata"].get("labels") or {}):
                continue
            if keep_fields is not None and not keep_fields(obj):
                continue
            items.append(obj)
        # etcd's key order (namespace, then name), and limit/continue pagination as the API server does it
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        metadata: Obj = {"resourceVersion": str(self._rv)}
        token = query.get("continue")
        if token:
            try:
                after = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = (str(after["namespace"]), str(after["name"]))
            except (ValueError, KeyError, TypeError):
                raise ApiError(
                    400, "BadRequest", "invalid continue token: continue key is not valid"
                ) from None
            items = [
                o for o in items if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > start
            ]
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            after = {"namespace": last.get("namespace") or "", "name": last["name"]}
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(after).encode()).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        info = RESOURCES[plural]
        return {
            "apiVersion": info.group_version,
            "kind": f"{info.kind}List",
            "metadata": metadata,
            "items": [self._present(plural, obj) for obj in items],
        }

    def _check_version(self, plural: str, current: Obj, body: Obj) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {_qualified(plural)} "
                f'"{current["metadata"]["name"]}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": current["metadata"]["name"], **_details(plural)},
            )

    def _update(self, plural: str, key: Key, current: Obj, body: Any, sub: str | None) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be an object")
        self._check_version(plural, current, body)
        new = copy.deepcopy(current)
        if sub == "status":
            new["status"] = copy.deepcopy(body.get("status") or {})
        else:
            kept = {
                k: current["metadata"][k]
                for k in ("uid", "creationTimestamp", "namespace", "name", "generation")
                if k in current["metadata"]
            }
            new = {**copy.deepcopy(body), "apiVersion": current["apiVersion"], "kind": current["kind"]}
            new["metadata"] = {**(body.get("metadata") or {}), **kept}
            if plural in ("nodes", "pods"):
                new["status"] = copy.deepcopy(current.get("status"))
        return self._present(plural, self._replace(plural, key, new))

    def _patch(
        self, plural: str, key: Key, current: Obj, body: Any, content_type: str, sub: str | None
    ) -> Obj:
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
            new = json_patch(current, body)
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch is an object")
            self._check_version(plural, current, body)
            patcher = merge_patch if content_type == "application/merge-patch+json" else strategic_merge_patch
            new = patcher(copy.deepcopy(current), body)
        else:
            raise ApiError(
                415, "UnsupportedMediaType", f"the patch content type {content_type!r} is not supported"
            )
        for immutable in ("uid", "name", "namespace", "creationTimestamp"):
            if immutable in current["metadata"]:
                new.setdefault("metadata", {})[immutable] = current["metadata"][immutable]
        return self._present(plural, self._replace(plural, key, new))

    def _delete(self, plural: str, key: Key, query: Any, body: Any) -> Obj:
        if plural == "pods":
            grace: int | None = None
            if query.get("gracePeriodSeconds") is not None:
                grace = int(query["gracePeriodSeconds"])
            elif isinstance(body, dict) and body.get("gracePeriodSeconds") is not None:
                grace = int(body["gracePeriodSeconds"])
            return self._start_terminating(key, grace)
        return self._remove(plural, key) or {}

    # ------------------------------------------------------------------------------------------- eviction

    def _scale(self, reference: Obj) -> int:
        """The scale of a pod's controller (a ReplicaSet's replicas; 0 for other kinds)."""
        if reference["kind"] == "ReplicaSet":
            rs = self._objects["replicasets"].get((reference["namespace"], reference["name"]))
            if rs is not None:
                return int(rs["spec"].get("replicas", 0))
        return 0

    def _pdb_status(self, pdb: Obj) -> Obj:
        namespace = pdb["metadata"]["namespace"]
        selector = (pdb.get("spec") or {}).get("selector")
        labels = (selector or {}).get("matchLabels") or {}
        index = (namespace, *next(iter(labels.items()))) if len(labels) == 1 else None
        owners = self._label_owners.get(index, {}) if index is not None else {}
        if index is not None and owners and not (selector or {}).get("matchExpressions"):
            # One-label budget (the common case): from the counters kept by _index_pod, no scan.
            spec = pdb.get("spec") or {}
            if spec.get("maxUnavailable") is None and not isinstance(spec.get("minAvailable"), str):
                expected = (
                    len(self._pods_by_label.get(index, ())) if spec.get("minAvailable") is not None else 0
                )
            else:
                expected = sum(
                    self._scale({"kind": by[0], "name": by[1], "namespace": namespace}) for by in owners if by
                )
            return pdb_status_of(pdb, self._label_ready.get(index, 0), expected)
        pods = self._select_pods(namespace, selector)
        return pdb_status(pdb, pods, pdb_expected(pdb, pods, self._scale))

    def _evict(self, key: Key, body: Obj, dry_run: bool = False) -> Obj:
        """The policy/v1 Eviction subresource, as pkg/registry/core/pod/storage/eviction.go decides: a pending,
        finished or terminating pod is deleted without a budget check; a pod under more than one budget is
        refused (500); an unready pod goes when the budget says AlwaysAllow, or when it is met and wants at
        least one healthy pod (IfHealthyBudget); otherwise the budget must allow a disruption (else 429).
        ``dryRun=All`` (in the body's deleteOptions or the query) checks everything and deletes nothing."""
        pod = self._objects["pods"].get(key)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{key[1]}" not found', {"name": key[1], "kind": "pods"})
        options = body.get("deleteOptions") or {}
        dry_run = dry_run or "All" in (options.get("dryRun") or [])
        grace = options.get("gracePeriodSeconds")
        phase = (pod.get("status") or {}).get("phase")
        if not (is_terminating(pod) or phase in ("Pending", "Succeeded", "Failed")):
            labels = pod["metadata"].get("labels") or {}
            budgets = [
                pdb
                for (namespace, _), pdb in self._objects["poddisruptionbudgets"].items()
                if namespace == key[0] and selector_matches((pdb.get("spec") or {}).get("selector"), labels)
            ]
            if len(budgets) > 1:
                raise ApiError(
                    500,
                    "",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                )
            if budgets:
                budget = budgets[0]
                status = self._pdb_status(budget)
                policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
                unready_may_go = not is_ready(pod) and (
                    policy == "AlwaysAllow"
                    or (status["currentHealthy"] >= status["desiredHealthy"] and status["desiredHealthy"] > 0)
                )
                if not unready_may_go and status["disruptionsAllowed"] <= 0:
                    name = budget["metadata"]["name"]
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {name} needs {status['desiredHealthy']} "
                                    f"healthy pods and has {status['currentHealthy']} currently",
                                }
                            ]
                        },
                    )
        if dry_run:
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        self.evictions.append(copy.deepcopy(pod))
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            self.last_eviction[node] = datetime.now(UTC)
        if phase not in ("Succeeded", "Failed") and not is_terminating(pod):
            marked = copy.deepcopy(pod)
            conditions = marked.setdefault("status", {}).setdefault("conditions", [])
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                    "lastTransitionTime": _now_iso(),
                }
            )
            self._replace("pods", key, marked)
        self._start_terminating(key, None if grace is None else int(grace))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
