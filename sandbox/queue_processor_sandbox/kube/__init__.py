"""A Kubernetes API server emulation on 127.0.0.1, for the real ``kubernetes`` client.

What it serves (JSON over HTTP, the paths and shapes of the Kubernetes API reference):

- core/v1 ``nodes`` (with ``/status``), ``pods`` (cluster-wide and per namespace), ``events``;
  apps/v1 ``daemonsets``, ``replicasets``; policy/v1 ``poddisruptionbudgets`` and the ``pods/eviction``
  subresource; coordination.k8s.io/v1 ``leases``;
- get, list (label selectors; field selectors ``metadata.name``, ``metadata.namespace``, ``spec.nodeName``,
  ``status.phase`` for pods; ``resourceVersion=0`` served from a cache that lags by ``cache_lag_s``, as the
  API server's watch cache may), create, replace (``metadata.resourceVersion`` must match, else 409 Conflict),
  patch (strategic merge, JSON merge, JSON patch), delete, deletecollection (``leases`` only); watch
  (selectors, bookmarks, metadata-only objects, 410 Expired from before the changes kept);
- graceful pod deletion: a pod gets a ``deletionTimestamp`` and disappears when its grace period has passed
  (a simulated kubelet); a ReplicaSet replaces its terminating pods on a schedulable node, and a DaemonSet
  recreates a deleted pod on its node, as their controllers do;
- evictions with PodDisruptionBudget arithmetic: 429 when the budget allows no disruption, 500 when a pod
  matches more than one budget, 404 for a missing pod; a pending or terminating pod is evicted without a
  budget check ("API-initiated Eviction");
- nodes that register (and turn Ready) some time after their instance launched;
- every request counted by verb and resource (:attr:`KubeSandbox.requests`), and fault injection
  (:meth:`KubeSandbox.inject_fault`).

Not served: deletecollection of other resources, admission, validation beyond what these behaviours need. Every duration
is simulated seconds turned into real ones by the :class:`~queue_processor_sandbox.clock.SandboxClock`.

The server runs an asyncio loop in a thread of its own, so synchronous clients (tests, the controller's thread
pool) and asynchronous ones can use it alike; its state is guarded by one lock.

Modules: :mod:`.store` (the object store, resourceVersions and indexes, :class:`ResourceInfo`),
:mod:`.controllers` (the simulated controllers: timers, node lifecycle, kubelet termination, ReplicaSet and
DaemonSet, scheduler, PodDisruptionBudget status and eviction), :mod:`.routes` (HTTP routing, status codes,
fault injection, JSON and patches) and :mod:`.sandbox` (:class:`KubeSandbox`, which ties them together). The
pure pieces (selectors, patches, budget arithmetic) live in :mod:`queue_processor_sandbox.kube_logic`.
"""

from __future__ import annotations

from queue_processor_sandbox.kube.routes import Fault
from queue_processor_sandbox.kube.sandbox import KubeSandbox
from queue_processor_sandbox.kube.store import RESOURCES, ResourceInfo

__all__ = ["RESOURCES", "Fault", "KubeSandbox", "ResourceInfo"]
