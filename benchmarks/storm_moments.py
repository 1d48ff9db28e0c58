"""Per-node moments of a Spot storm, as the API server records them: what ``storm.py``'s detect → cordon and
cordon → drained figures are computed from, one exact value per node (no histogram, no sampling).

- ``published``: the wall-clock time (``time.time()``) at which the sandbox's publication of the node's Spot
  warning returned: its message was in the SQS queue, receivable (``storm.py`` records it).
- ``cordoned``: when the API server stored the write that made the node's ``spec.unschedulable`` true. On the
  emulation, the store's own write (a hook on its bookkeeping of every write, run under the emulation's lock);
  on the real control plane, the ``stageTimestamp`` of the first node ``patch``/``update`` the controller's
  ServiceAccount made after :meth:`Moments.start` that was answered 200 (the audit log; the controller's cordon
  is its first write to the node: unschedulable, taints and its record in one patch).
- ``drained``: when the last application pod (neither a DaemonSet's nor a mirror pod) bound to the node left
  the API server: every one that was on it, the replacements scheduled onto it before its cordon included. On
  the emulation, the store's removal of the pod (after its grace period); on the real control plane, the moment
  the sandbox's own informer of the run's pods saw the deletion (the watch's delay after the API server's write
  included: KWOK's pod deletions are not in the audit log). A node some application pod is still bound to when
  :meth:`Moments.figures` is called is not drained and not counted.

The hooks are the sandbox's private attributes (``KubeSandbox._store``, ``RealKube._pods``): when they are not
there, the figures are ``None``, and the run goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

__all__ = ["Moments", "is_application_pod", "quantile"]

Obj = dict[str, Any]


def is_application_pod(pod: Obj) -> bool:
    """Whether a drain evicts ``pod``: neither a DaemonSet's nor a mirror pod."""
    metadata = pod.get("metadata") or {}
    return not any(
        ref.get("kind") == "DaemonSet" for ref in metadata.get("ownerReferences") or []
    ) and "kubernetes.io/config.mirror" not in (metadata.get("annotations") or {})


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0 ≤ q ≤ 1) of ``values``, interpolated linearly between the two nearest order
    statistics (numpy's default method); ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return round(ordered[below] + (ordered[above] - ordered[below]) * (position - below), 3)


class _Stamped(dict[Any, Any]):
    """A dict that tells ``on_set(key, value)`` before each item is set (the real plane informer's ``gone``)."""

    def __init__(self, base: dict[Any, Any], on_set: Callable[[Any, Any], None]) -> None:
        super().__init__(base)
        self.on_set = on_set

    def __setitem__(self, key: Any, value: Any) -> None:
        self.on_set(key, value)
        super().__setitem__(key, value)


class Moments:
    """The moments of the storm's ``nodes`` (node names) in ``sandbox`` (see the module docstring): hooks in
    from :meth:`start` to :meth:`stop`; ``controller_user`` is the controller's Kubernetes user (the real
    plane's audit log is read for it) and ``plane`` the real control plane (``None``: the emulation)."""

    def __init__(
        self, sandbox: Any, nodes: Iterable[str], plane: Any = None, controller_user: str = ""
    ) -> None:
        self.sandbox = sandbox
        self.nodes = frozenset(nodes)
        self.plane = plane
        self.controller_user = controller_user
        self.published: dict[str, float] = {}
        self.cordoned: dict[str, float] = {}
        self.last_gone: dict[str, float] = {}
        self.hooked = False
        self._lock = threading.Lock()
        self._audit_offset = 0
        self._undo: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------------------------------ hooks

    def start(self) -> None:
        """Hook into the API server's record (before the burst is published)."""
        if self.plane is None:
            self._hook_store()
        else:
            self._audit_offset = self.plane.audit_log.stat().st_size
            self._hook_informer()

    def stop(self) -> None:
        """Unhook (the moments recorded stay); idempotent."""
        self._undo()
        self._undo = lambda: None

    def _hook_store(self) -> None:
        store = getattr(self.sandbox.kube, "_store", None)
        if store is None or not callable(getattr(store, "stored", None)):
            return
        original = store.stored

        def stored(plural: str, key: tuple[str, str], old: Obj | None, new: Obj | None) -> None:
            at = time.time()
            if plural == "nodes" and new is not None and key[1] in self.nodes and key[1] not in self.cordoned:
                if (new.get("spec") or {}).get("unschedulable") and not ((old or {}).get("spec") or {}).get(
                    "unschedulable"
                ):
                    self.cordoned[key[1]] = at
            elif plural == "pods" and new is None and old is not None:
                self._gone(old, at)
            original(plural, key, old, new)

        store.stored = stored  # an instance attribute: the store calls self.stored
        self.hooked = True

        def undo() -> None:
            del store.stored

        self._undo = undo

    def _hook_informer(self) -> None:
        informer = getattr(self.sandbox.kube, "_pods", None)
        if informer is None or not isinstance(getattr(informer, "gone", None), dict):
            return
        with informer.lock:
            informer.gone = _Stamped(informer.gone, lambda _key, pod: self._gone(pod, time.time()))
        self.hooked = True

        def undo() -> None:
            with informer.lock:
                informer.gone = dict(informer.gone)

        self._undo = undo

    def _gone(self, pod: Obj, at: float) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in self.nodes and is_application_pod(pod):
            with self._lock:
                self.last_gone[node] = max(at, self.last_gone.get(node, at))

    def _audit_cordons(self) -> None:
        """The real plane's cordons: the first node write of the controller answered 200, per node."""
        events, self._audit_offset = self.plane.audit_events(self._audit_offset)
        for event in events:
            ref = event.get("objectRef") or {}
            if (
                event.get("stage") == "ResponseComplete"
                and event.get("verb") in ("patch", "update")
                and ref.get("resource") == "nodes"
                and not ref.get("subresource")
                and ref.get("name") in self.nodes
                and ref.get("name") not in self.cordoned
                and (event.get("user") or {}).get("username") == self.controller_user
                and int((event.get("responseStatus") or {}).get("code", 0)) == 200
            ):
                self.cordoned[ref["name"]] = datetime.fromisoformat(event["stageTimestamp"]).timestamp()

    # ------------------------------------------------------------------------------------------ figures

    def figures(self) -> dict[str, Any]:
        """p50, p99 and max of detect → cordon (published → cordoned) and cordon → drained (cordoned →
        drained), in seconds, and how many nodes each is over; ``None`` figures when the hooks were not
        available."""
        if self.plane is not None:
            self._audit_cordons()
        detect = [
            self.cordoned[n] - self.published[n]
            for n in self.nodes
            if n in self.cordoned and n in self.published
        ]
        drained: list[float] = []
        for node, cordoned in self.cordoned.items():
            if any(is_application_pod(pod) for pod in self.sandbox.kube.pods_on(node)):
                continue  # not drained (yet)
            with self._lock:
                last = self.last_gone.get(node, cordoned)
            drained.append(max(last, cordoned) - cordoned)
        hooked = self.hooked or self.plane is not None  # the real plane's cordons come from the audit log
        return {
            "p50_detect_to_cordon_s": quantile(detect, 0.5) if hooked else None,
            "p99_detect_to_cordon_s": quantile(detect, 0.99) if hooked else None,
            "max_detect_to_cordon_s": round(max(detect), 3) if detect and hooked else None,
            "detect_to_cordon_nodes": len(detect),
            "p50_cordon_to_drained_s": quantile(drained, 0.5) if self.hooked else None,
            "p99_cordon_to_drained_s": quantile(drained, 0.99) if self.hooked else None,
            "max_cordon_to_drained_s": round(max(drained), 3) if drained and self.hooked else None,
            "cordon_to_drained_nodes": len(drained) if self.hooked else 0,
        }
