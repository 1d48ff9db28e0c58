""":class:`KubeSandbox`, the public face of the Kubernetes emulation: it ties the parts together.

It owns the lock that guards all state, the :class:`~queue_processor_sandbox.kube.store.ObjectStore`, the
:class:`~queue_processor_sandbox.kube.controllers.Controllers` that act on it and the
:class:`~queue_processor_sandbox.kube.routes.ApiRoutes` that serve it; it runs the server and the controllers'
timers on an asyncio loop in a thread of its own, and offers the helpers tests and the sandbox use to build a
cluster (nodes, ReplicaSets, DaemonSets, PodDisruptionBudgets, pods) and to look at it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from aiohttp import web

from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.cluster import MANUAL_STATUS
from queue_processor_sandbox.kube.controllers import Controllers, new_pod, pod_template
from queue_processor_sandbox.kube.routes import ApiRoutes, Fault
from queue_processor_sandbox.kube.store import RESOURCES, Key, ObjectStore
from queue_processor_sandbox.kube_logic import Obj

__all__ = ["KubeSandbox"]


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
        self.tick_s = tick_s
        self.lock = threading.RLock()
        self.requests: Counter[str] = Counter()
        """Requests served, by ``"<verb> <resource>[/<subresource>]"`` (``list pods``, ``create pods/eviction``)."""
        self.evictions: list[Obj] = []
        """Every pod an eviction deleted, as it was just before (tests check which pods were evicted)."""
        self.last_eviction: dict[str, datetime] = {}
        """Node name → wall-clock time (aware UTC) of the last eviction of a pod bound to it."""
        self.first_eviction: dict[str, datetime] = {}
        """Node name → wall-clock time (aware UTC) of the first eviction of a pod bound to it."""
        self._store = ObjectStore()
        self._controllers = Controllers(
            self._store,
            self.clock,
            pod_start_s=pod_start_s,
            evictions=self.evictions,
            last_eviction=self.last_eviction,
            first_eviction=self.first_eviction,
        )
        self._store.on_pod_removed = self._controllers.after_pod_gone
        self._routes = ApiRoutes(
            self._store,
            self._controllers,
            lock=self.lock,
            clock=self.clock,
            cache_lag_s=cache_lag_s,
            requests=self.requests,
        )
        self._objects: dict[str, dict[Key, Obj]] = self._store.objects
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self.port = 0
        for namespace in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.ensure_namespace(namespace)

    @property
    def cache_lag_s(self) -> float:
        """How stale (simulated seconds) a ``resourceVersion=0`` list may be."""
        return self._routes.cache_lag_s

    @cache_lag_s.setter
    def cache_lag_s(self, value: float) -> None:
        self._routes.cache_lag_s = value

    @property
    def pod_start_s(self) -> float:
        """How long (simulated seconds) a scheduled pod takes to become Ready."""
        return self._controllers.pod_start_s

    @pod_start_s.setter
    def pod_start_s(self, value: float) -> None:
        self._controllers.pod_start_s = value

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
        self._runner = web.AppRunner(self._routes.application(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self._routes.port = self.port
        started.set()
        ticker = asyncio.create_task(self._tick_forever())
        try:
            await self._stopping.wait()
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            self._routes.close()
            await self._runner.cleanup()

    async def _tick_forever(self) -> None:
        while True:
            with self.lock:
                self._controllers.run_due_timers()
            await asyncio.sleep(self.tick_s)

    # ---------------------------------------------------------------------------------- client helpers

    def compact(self, *, end_watches: bool = False) -> None:
        """Forget the changes kept for watches, as the API server's etcd compaction does (every 5 minutes by
        default): a watch from a resourceVersion before now is then told 410 Expired. ``end_watches`` also drops
        the watches being served (an API server restarted after the compaction): their clients come back with
        an old resourceVersion, are told 410, and list again."""
        with self.lock:  # one step: no watch sees the compaction without the drop
            if end_watches:
                self._routes.end_watches()
            self._store.compact()

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
        reset: bool = False,
    ) -> Fault:
        """Add a :class:`Fault`; returns it (its ``count`` drops as requests consume it)."""
        fault = Fault(verb, resource, status, count, delay_s, retry_after_s, reset)
        with self.lock:
            self._routes.faults.append(fault)
        return fault

    # ------------------------------------------------------------------------------------- cluster state

    def denied(self) -> Counter[tuple[str, str]]:
        """Requests answered 403 Forbidden, by (user, ``"<verb> <resource>"``); the emulation has no RBAC, so
        only :meth:`inject_fault` with ``status=403`` answers any (its user: ``"emulated"``)."""
        with self.lock:
            return Counter({("emulated", what): n for what, n in self._routes.forbidden.items()})

    def too_many_requests(self) -> Counter[str]:
        """Requests answered 429 Too Many Requests, by ``"<verb> <resource>"``: the evictions a
        PodDisruptionBudget refused, and those :meth:`inject_fault` answered so."""
        with self.lock:
            return Counter(self._routes.too_many)

    def budget_refused_at(self) -> dict[tuple[str, str], float]:
        """(namespace, name) of each pod whose eviction a PodDisruptionBudget refused (429) → when the last
        refusal was (``time.monotonic()``, real seconds)."""
        with self.lock:
            return dict(self._routes.budget_refused_at)

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
            return [
                copy.deepcopy(self._objects["pods"][key]) for key in self._store.pods_by_node.get(node, ())
            ]

    def ensure_namespace(self, namespace: str) -> None:
        """Create ``namespace`` unless it exists (the helpers below do it for the namespaces they use; a request
        through the API into a missing namespace is answered 404, as the API server does)."""
        with self.lock:
            self._store.ensure_namespace(namespace)

    def add_node(
        self,
        name: str,
        *,
        provider_id: str = "",
        labels: dict[str, str] | None = None,
        register_after_s: float = 0.0,
        ready_after_s: float | None = 0.0,
    ) -> None:
        """Add a Node (``kubernetes.io/hostname`` label = ``name``). With ``register_after_s`` it appears that
        many simulated seconds from now; it turns Ready ``ready_after_s`` after it appears, never when
        ``ready_after_s`` is ``None`` (a kubelet that registers and never becomes Ready). DaemonSets get a pod
        on it when it appears."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"providerID": provider_id} if provider_id else {},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]},
        }
        with self.lock:
            self._controllers.schedule(register_after_s, "register-node", ("", name), (node, ready_after_s))

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
            self._store.remove("nodes", ("", name))  # first, so that no DaemonSet puts a pod back on it
            for key in list(self._store.pods_by_node.get(name, ())):
                self._store.remove("pods", key)

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
        template = pod_template(labels, self.clock.grace(grace_s), empty_dir, priority_class)
        names = []
        for index in range(replicas):
            pod_name = f"{name}-{index:05d}"
            pod = new_pod(namespace, pod_name, nodes[index % len(nodes)], template, rs)
            names.append(pod_name)
            with self.lock:
                self._store.insert("pods", pod)
        return names

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
                        "spec": pod_template(labels, self.clock.grace(grace_s), False, priority_class)[
                            "spec"
                        ],
                    },
                },
            },
        )
        with self.lock:
            for node in list(self._objects["nodes"].values()):
                self._controllers.daemon_pod(ds, node["metadata"]["name"])

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
        unhealthy_pod_eviction_policy: str | None = None,
    ) -> None:
        """A policy/v1 PodDisruptionBudget selecting ``match_labels``."""
        spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        if unhealthy_pod_eviction_policy is not None:
            spec["unhealthyPodEvictionPolicy"] = unhealthy_pod_eviction_policy
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
            self._store.replace("poddisruptionbudgets", key, pdb)

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
        """A pod without a controller (unreplicated), or a mirror (static) pod with ``mirror=True``; in
        ``phase``, and Ready when Running and ``ready`` (at once: ``wait`` is for the real backend), with
        ``annotations``."""
        template = pod_template(labels or {}, self.clock.grace(grace_s), empty_dir, priority_class)
        pod = new_pod(namespace, name, node, template, None, phase=phase)
        if annotations:
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        if not ready:
            pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        if phase != "Running" or not ready:  # no kubelet runs it (as KWOK disregards it on the real server)
            pod["metadata"].setdefault("annotations", {})[MANUAL_STATUS] = "manual"
        if mirror:
            pod["metadata"].setdefault("annotations", {})["kubernetes.io/config.mirror"] = uuid.uuid4().hex
            pod["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node, "controller": True}
            ]
        with self.lock:
            self._store.insert("pods", pod)

    # ----------------------------------------------------------------------------------- object helpers

    def _store_new(self, plural: str, obj: Obj) -> Obj:
        info = RESOURCES[plural]
        with self.lock:
            return self._store.insert(plural, {"apiVersion": info.group_version, "kind": info.kind, **obj})

    # The store's and controllers' views that tests compare with the pure arithmetic of kube_logic (lock held).

    def _select_pods(self, namespace: str, selector: Obj | None) -> list[Obj]:
        """The pods of ``namespace`` that a LabelSelector object selects (through the label index when it
        has matchLabels)."""
        return self._store.select_pods(namespace, selector)

    def _scale(self, reference: Obj) -> int:
        """The scale of a pod's controller (a ReplicaSet's replicas; 0 for other kinds)."""
        return self._controllers.scale(reference)

    def _pdb_status(self, pdb: Obj) -> Obj:
        """A PodDisruptionBudget's status as the disruption controller would write it now."""
        return self._controllers.pdb_status(pdb)
