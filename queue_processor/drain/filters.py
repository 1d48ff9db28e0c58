"""Which pods of a node a drain evicts: kubectl-drain's pod filters, pure (no I/O).

Modelled on ``k8s.io/kubectl/pkg/drain`` (``filters.go``; the shape only): each filter is a small named function
that looks at one pod and says evict, skip or error, with a message; :func:`plan_drain` runs every pod through the
filters in one pass and a pod's verdict is the first result that is not EVICT. Warnings of the filters the pod
passed (emptyDir, no controller) are kept in its reason. Behaviour documented in
https://kubernetes.io/docs/reference/kubectl/generated/kubectl_drain/ and
https://kubernetes.io/docs/tasks/administer-cluster/safely-drain-node/.

Pods are plain dicts in the Kubernetes JSON shape, as the API returns them::

    {"metadata": {"name": str, "namespace": str, "annotations": {str: str},
                  "ownerReferences": [{"kind": str, "name": str, "controller": bool, ...}],
                  "deletionTimestamp": "2024-05-01T12:00:00Z" | None},
     "spec": {"nodeName": str, "volumes": [{"name": str, "emptyDir": {...}, ...}]},
     "status": {"phase": "Pending" | "Running" | "Succeeded" | "Failed" | "Unknown"}}

Missing or mistyped fields count as absent: the filters never raise on a pod.

Filters, in the order they run (:data:`FILTERS`):

1. :func:`own_pod_filter`: the controller's own pod is not evicted with the others (the handler evicts it last).
2. :func:`mirror_filter`: mirror (static) pods are skipped; the API server cannot delete them.
3. :func:`daemonset_filter`: DaemonSet-managed pods are skipped (``IGNORE_DAEMON_SETS``) or block the drain.
4. :func:`terminating_filter`: pods already being deleted are not evicted again, only waited for.
5. :func:`finished_filter`: Succeeded and Failed pods are evicted without the checks below.
6. :func:`local_storage_filter`: emptyDir pods are evicted with a warning (``DELETE_LOCAL_DATA``) or block.
7. :func:`unreplicated_filter`: pods without a controller are evicted with a warning (force) or block.

Differences from kubectl, on purpose:

- kubectl's DaemonSet filter GETs the pod's DaemonSet and, when it no longer exists, evicts the orphan with
  ``--force``. That needs I/O, so it is not modelled: a pod whose controller reference names a DaemonSet is
  DaemonSet-managed, whether or not the DaemonSet still exists.
- kubectl deletes *finished* DaemonSet-managed pods. Here a DaemonSet-managed pod is never evicted: a finished
  one is skipped (whatever ``ignore_daemonsets``), since it runs nothing and the DaemonSet controller removes it.
- kubectl evicts a terminating pod again and waits for it; here it is only waited for (an eviction of a pod
  that is already being deleted changes nothing). Both skip, entirely, pods deleted longer than
  ``--skip-wait-for-delete-timeout`` ago.
- kubectl keeps only the last warning of a pod; here every warning is kept in the reason.

A plan with any ERROR decision is, in kubectl, a drain that does not start; :attr:`DrainPlan.errors` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

__all__ = [
    "FILTERS",
    "MIRROR_POD_ANNOTATION",
    "OWN_POD",
    "DrainOptions",
    "DrainPlan",
    "FilterStatus",
    "PodDecision",
    "PodFilter",
    "Verdict",
    "controller_of",
    "daemonset_filter",
    "deletion_timestamp",
    "finished_filter",
    "has_local_storage",
    "is_daemonset_pod",
    "is_finished",
    "is_mirror_pod",
    "is_terminating",
    "local_storage_filter",
    "mirror_filter",
    "own_pod_filter",
    "plan_drain",
    "pod_key",
    "terminating_filter",
    "unreplicated_filter",
]

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
"""Annotation the kubelet puts on the API mirror of a static pod
(https://kubernetes.io/docs/tasks/configure-pod-container/static-pod/)."""

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class DrainOptions:
    """The switches of a drain, kubectl's ``Helper`` fields with NTH's defaults.

    - ``ignore_daemonsets``: skip DaemonSet-managed pods; when false, one makes the plan an error
      (``IGNORE_DAEMON_SETS``; kubectl ``--ignore-daemonsets``).
    - ``delete_emptydir_data``: evict pods with emptyDir volumes, whose data is lost; when false, one makes the
      plan an error (``DELETE_LOCAL_DATA``; kubectl ``--delete-emptydir-data``).
    - ``force``: evict pods that declare no controller (nothing recreates them); when false, one makes the plan
      an error (kubectl ``--force``; NTH always drains with ``Force: true``).
    - ``own_pod``: ``(namespace, name)`` of the controller's own pod, never evicted, or ``None``.
    - ``skip_wait_for_delete_timeout_s``: a pod deleted longer than this ago is neither evicted nor waited for
      (kubectl ``--skip-wait-for-delete-timeout``); ``0`` turns it off.

    See https://kubernetes.io/docs/reference/kubectl/generated/kubectl_drain/.
    """

    ignore_daemonsets: bool = True
    delete_emptydir_data: bool = True
    force: bool = True
    own_pod: tuple[str, str] | None = None
    skip_wait_for_delete_timeout_s: float = 0


class Verdict(StrEnum):
    """What a drain does with one pod: evict it, leave it (skip), or refuse to drain the node (error)."""

    EVICT = "evict"
    SKIP = "skip"
    ERROR = "error"


@dataclass(frozen=True)
class PodDecision:
    """The verdict on one pod and why.

    ``reason`` starts with the name of the filter that decided (``"mirror: mirror (static) pod"``,
    ``"unreplicated: cannot delete Pods that declare no controller (...)"``), followed by the warnings of the
    filters the pod passed, joined with ``"; "``. An EVICT without warnings has the reason ``"ok"``.
    ``awaiting_deletion`` marks a SKIP pod that is already being deleted and must still be waited for.
    ``pod`` is the pod dict itself (not copied); it takes no part in equality or ``repr``.
    """

    namespace: str
    name: str
    verdict: Verdict
    reason: str
    pod: dict[str, Any] = field(repr=False, compare=False)
    awaiting_deletion: bool = False


@dataclass(frozen=True)
class DrainPlan:
    """The decisions on every pod of a node, in the order the pods were given, one per pod."""

    decisions: tuple[PodDecision, ...]

    @property
    def evict(self) -> list[dict[str, Any]]:
        """The pods to evict (policy/v1 Eviction;
        https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/)."""
        return [d.pod for d in self.decisions if d.verdict is Verdict.EVICT]

    @property
    def skipped(self) -> list[PodDecision]:
        """The decisions of pods the drain leaves alone (own, mirror, DaemonSet-managed, terminating)."""
        return [d for d in self.decisions if d.verdict is Verdict.SKIP]

    @property
    def errors(self) -> list[PodDecision]:
        """The decisions that forbid the drain (kubectl refuses to drain a node when this is not empty)."""
        return [d for d in self.decisions if d.verdict is Verdict.ERROR]

    @property
    def wait_for(self) -> list[dict[str, Any]]:
        """The pods to wait for until they are gone: the evicted ones and those already being deleted,
        except those deleted longer than ``skip_wait_for_delete_timeout_s`` ago."""
        return [d.pod for d in self.decisions if d.verdict is Verdict.EVICT or d.awaiting_deletion]


@dataclass(frozen=True)
class FilterStatus:
    """What one filter says of one pod: ``verdict``, ``message`` (``"filter: text"``, empty for a plain EVICT;
    an EVICT with a message is a warning) and ``awaiting_deletion`` (see :class:`PodDecision`)."""

    verdict: Verdict
    message: str = ""
    awaiting_deletion: bool = False


OK = FilterStatus(Verdict.EVICT)

PodFilter = Callable[[Mapping[str, Any], DrainOptions, datetime], FilterStatus]
"""A filter: ``(pod, options, now) -> FilterStatus``; pure, never raises."""


# --- reading a pod -------------------------------------------------------------------------------------------


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: object) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(pod.get("metadata"))


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of a pod (``metadata.namespace``, ``metadata.name``); ``""`` for a missing one."""
    metadata = _metadata(pod)
    namespace, name = metadata.get("namespace"), metadata.get("name")
    return (namespace if isinstance(namespace, str) else "", name if isinstance(name, str) else "")


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller: the first ``metadata.ownerReferences`` entry with ``controller: true``, or ``None``
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/)."""
    for reference in _items(_metadata(pod).get("ownerReferences")):
        if reference.get("controller") is True:
            return reference
    return None


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's controller reference is of kind ``DaemonSet``
    (https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/)."""
    controller = controller_of(pod)
    return controller is not None and controller.get("kind") == "DaemonSet"


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is the API mirror of a static pod: it carries the ``kubernetes.io/config.mirror``
    annotation (https://kubernetes.io/docs/tasks/configure-pod-container/static-pod/)."""
    return MIRROR_POD_ANNOTATION in _mapping(_metadata(pod).get("annotations"))


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """Whether ``metadata.deletionTimestamp`` is set: the pod is being deleted
    (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination)."""
    return _metadata(pod).get("deletionTimestamp") is not None


def deletion_timestamp(pod: Mapping[str, Any]) -> datetime | None:
    """``metadata.deletionTimestamp`` as an aware datetime (RFC 3339 text, or a datetime; naive means UTC), or
    ``None`` when it is unset or cannot be read."""
    value = _metadata(pod).get("deletionTimestamp")
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def is_finished(pod: Mapping[str, Any]) -> bool:
    """Whether ``status.phase`` is ``Succeeded`` or ``Failed``
    (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase)."""
    phase = _mapping(pod.get("status")).get("phase")
    return isinstance(phase, str) and phase in FINISHED_PHASES


def has_local_storage(pod: Mapping[str, Any]) -> bool:
    """Whether one of ``spec.volumes`` is an ``emptyDir``, whose data goes with the pod
    (https://kubernetes.io/docs/concepts/storage/volumes/#emptydir)."""
    return any(
        volume.get("emptyDir") is not None for volume in _items(_mapping(pod.get("spec")).get("volumes"))
    )


# --- the filters ---------------------------------------------------------------------------------------------


#: The reason :func:`own_pod_filter` gives: the handler evicts that pod itself, last, once the rest is drained.
OWN_POD = "own-pod"


def own_pod_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """SKIP the controller's own pod (``options.own_pod``): a drain does not evict the process running it; the
    handler evicts it last, once the node is drained (:meth:`queue_processor.handler.Handler`, "leave")."""
    if options.own_pod is not None and pod_key(pod) == tuple(options.own_pod):
        return FilterStatus(Verdict.SKIP, OWN_POD)
    return OK


def mirror_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """SKIP mirror (static) pods: the kubelet owns them, the API server cannot delete them
    (https://kubernetes.io/docs/tasks/configure-pod-container/static-pod/)."""
    if is_mirror_pod(pod):
        return FilterStatus(Verdict.SKIP, "mirror: mirror (static) pod")
    return OK


def daemonset_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """DaemonSet-managed pods: SKIP with ``ignore_daemonsets``, else ERROR; a finished one is always SKIP.

    The DaemonSet controller ignores unschedulable nodes and would recreate an evicted pod at once
    (https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/). kubectl also deletes, with
    ``--force``, a pod whose DaemonSet no longer exists; finding that out needs a GET, so it is not modelled here.
    """
    if not is_daemonset_pod(pod):
        return OK
    if options.ignore_daemonsets:
        return FilterStatus(Verdict.SKIP, "daemonset: DaemonSet-managed pod")
    if is_finished(pod):
        return FilterStatus(Verdict.SKIP, "daemonset: finished DaemonSet-managed pod")
    return FilterStatus(
        Verdict.ERROR,
        "daemonset: cannot delete DaemonSet-managed Pods (set IGNORE_DAEMON_SETS=true to skip them)",
    )


def terminating_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """Pods already being deleted (``metadata.deletionTimestamp``): SKIP the eviction, wait for them to go.

    With ``skip_wait_for_delete_timeout_s > 0``, a pod deleted longer ago than that is not waited for either
    (kubectl ``--skip-wait-for-delete-timeout``: e.g. on an unready node whose kubelet never confirms deletion).
    A deletionTimestamp that cannot be read counts as recent. See
    https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination.
    """
    if not is_terminating(pod):
        return OK
    timeout = options.skip_wait_for_delete_timeout_s
    deleted_at = deletion_timestamp(pod)
    if timeout > 0 and deleted_at is not None and (now - deleted_at).total_seconds() > timeout:
        return FilterStatus(
            Verdict.SKIP,
            f"terminating: deleted more than {timeout:g}s ago, not waited for (skip-wait timeout)",
        )
    return FilterStatus(Verdict.SKIP, "terminating: already being deleted", awaiting_deletion=True)


def finished_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """EVICT Succeeded and Failed pods, noting their phase; the filters after this one let them through, as
    kubectl deletes any finished pod (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase).
    """
    if is_finished(pod):
        return FilterStatus(Verdict.EVICT, f"finished: {_mapping(pod.get('status')).get('phase')}")
    return OK


def local_storage_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """Running pods with an emptyDir volume: EVICT with a warning with ``delete_emptydir_data``, else ERROR
    (their data is deleted with them; https://kubernetes.io/docs/concepts/storage/volumes/#emptydir)."""
    if not has_local_storage(pod) or is_finished(pod):
        return OK
    if options.delete_emptydir_data:
        return FilterStatus(Verdict.EVICT, "local-storage: uses emptyDir (its data is deleted)")
    return FilterStatus(
        Verdict.ERROR,
        "local-storage: cannot delete Pods with local storage (set DELETE_LOCAL_DATA=true to delete their emptyDir)",
    )


def unreplicated_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """Running pods without a controller reference: EVICT with a warning with ``force``, else ERROR (nothing
    recreates them elsewhere; https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/).
    """
    if is_finished(pod) or controller_of(pod) is not None:
        return OK
    if options.force:
        return FilterStatus(Verdict.EVICT, "unreplicated: no controller")
    return FilterStatus(
        Verdict.ERROR, "unreplicated: cannot delete Pods that declare no controller (force is off)"
    )


FILTERS: tuple[PodFilter, ...] = (
    own_pod_filter,
    mirror_filter,
    daemonset_filter,
    terminating_filter,
    finished_filter,
    local_storage_filter,
    unreplicated_filter,
)
"""The filters in the order :func:`plan_drain` runs them; the first that does not say EVICT decides."""


# --- the plan ------------------------------------------------------------------------------------------------


def _decide(pod: dict[str, Any], options: DrainOptions, now: datetime) -> PodDecision:
    namespace, name = pod_key(pod)
    warnings: list[str] = []
    for pod_filter in FILTERS:
        status = pod_filter(pod, options, now)
        if status.verdict is not Verdict.EVICT:
            reason = "; ".join([status.message, *warnings])
            return PodDecision(namespace, name, status.verdict, reason, pod, status.awaiting_deletion)
        if status.message:
            warnings.append(status.message)
    return PodDecision(namespace, name, Verdict.EVICT, "; ".join(warnings) or "ok", pod)


def plan_drain(
    pods: Iterable[dict[str, Any]], options: DrainOptions, *, now: datetime | None = None
) -> DrainPlan:
    """Run every pod through :data:`FILTERS` and return one :class:`PodDecision` per pod, in input order.

    ``pods`` are pod dicts in the API's JSON shape (a ``PodList``'s ``items`` for the node, typically listed with
    ``fieldSelector=spec.nodeName=<node>``). ``now`` (aware; naive means UTC) is the time deletionTimestamps are
    compared with, the current time by default. Pure and total: it never raises on a pod, whatever its shape.
    Semantics of ``kubectl drain``: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_drain/.
    """
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return DrainPlan(tuple(_decide(pod, options, now) for pod in pods))
