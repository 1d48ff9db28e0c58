"""Which pods of a node a drain evicts: kubectl-drain's pod filters (``k8s.io/kubectl/pkg/drain``), pure.

Each filter of :data:`FILTERS` says evict, skip or error for one pod; the first not EVICT decides. Pods are API JSON
dicts; missing or mistyped fields count as absent (no filter raises). Unlike kubectl, on purpose: a DaemonSet's pod
is never evicted (even with the DaemonSet gone or the pod finished); a terminating pod is only waited for; every
warning is kept in the reason."""

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
"""Annotation the kubelet puts on a static pod's API mirror ("Static Pods")."""

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class DrainOptions:
    """A drain's switches (kubectl ``Helper`` fields, NTH's defaults). When false, each of the first three makes a
    matching pod an error: ``ignore_daemonsets`` (IGNORE_DAEMON_SETS), ``delete_emptydir_data`` (DELETE_LOCAL_DATA),
    ``force`` (pods without a controller). ``own_pod``: ``(namespace, name)`` never evicted;
    ``skip_wait_for_delete_timeout_s``: a pod deleted longer ago is not waited for (0: off)."""

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
    """The verdict on one pod: ``reason`` is the deciding filter's message, then the warnings passed (``"ok"``: none);
    ``awaiting_deletion``: a SKIP pod being deleted, still waited for; ``pod``: the dict (not copied, not compared)."""

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
        """The pods to evict."""
        return [d.pod for d in self.decisions if d.verdict is Verdict.EVICT]

    @property
    def skipped(self) -> list[PodDecision]:
        """The decisions of pods the drain leaves alone (own, mirror, DaemonSet-managed, terminating)."""
        return [d for d in self.decisions if d.verdict is Verdict.SKIP]

    @property
    def errors(self) -> list[PodDecision]:
        """The decisions that forbid the drain."""
        return [d for d in self.decisions if d.verdict is Verdict.ERROR]

    @property
    def wait_for(self) -> list[dict[str, Any]]:
        """The pods to wait for: those evicted and those being deleted (unless past the skip-wait timeout)."""
        return [d.pod for d in self.decisions if d.verdict is Verdict.EVICT or d.awaiting_deletion]


@dataclass(frozen=True)
class FilterStatus:
    """One filter's ``verdict`` on a pod, its ``message`` (a warning on an EVICT) and ``awaiting_deletion``."""

    verdict: Verdict
    message: str = ""
    awaiting_deletion: bool = False


OK = FilterStatus(Verdict.EVICT)

PodFilter = Callable[[Mapping[str, Any], DrainOptions, datetime], FilterStatus]
"""A filter: ``(pod, options, now) -> FilterStatus``; pure, never raises."""


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
    """The first ``metadata.ownerReferences`` entry with ``controller: true``, or ``None``."""
    for reference in _items(_metadata(pod).get("ownerReferences")):
        if reference.get("controller") is True:
            return reference
    return None


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's controller reference is of kind ``DaemonSet``."""
    controller = controller_of(pod)
    return controller is not None and controller.get("kind") == "DaemonSet"


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries :data:`MIRROR_POD_ANNOTATION` (a static pod's mirror)."""
    return MIRROR_POD_ANNOTATION in _mapping(_metadata(pod).get("annotations"))


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """Whether ``metadata.deletionTimestamp`` is set (the pod is being deleted)."""
    return _metadata(pod).get("deletionTimestamp") is not None


def deletion_timestamp(pod: Mapping[str, Any]) -> datetime | None:
    """``metadata.deletionTimestamp`` as an aware datetime (naive means UTC), or ``None`` if unset or unreadable."""
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
    """Whether ``status.phase`` is ``Succeeded`` or ``Failed``."""
    phase = _mapping(pod.get("status")).get("phase")
    return isinstance(phase, str) and phase in FINISHED_PHASES


def has_local_storage(pod: Mapping[str, Any]) -> bool:
    """Whether one of ``spec.volumes`` is an ``emptyDir`` (its data goes with the pod)."""
    return any(
        volume.get("emptyDir") is not None for volume in _items(_mapping(pod.get("spec")).get("volumes"))
    )


#: The reason :func:`own_pod_filter` gives: the handler evicts that pod itself, last, once the rest is drained.
OWN_POD = "own-pod"


def own_pod_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """SKIP the controller's own pod (``options.own_pod``): the handler evicts it last, once the node is drained."""
    if options.own_pod is not None and pod_key(pod) == tuple(options.own_pod):
        return FilterStatus(Verdict.SKIP, OWN_POD)
    return OK


def mirror_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """SKIP mirror (static) pods: the kubelet owns them; the API server cannot delete them."""
    if is_mirror_pod(pod):
        return FilterStatus(Verdict.SKIP, "mirror: mirror (static) pod")
    return OK


def daemonset_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """DaemonSet-managed pods: SKIP with ``ignore_daemonsets``, else ERROR; a finished one is always SKIP. The
    DaemonSet controller ignores unschedulable nodes and would recreate an evicted pod at once ("DaemonSet")."""
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
    """Pods being deleted: SKIP the eviction and wait for them, unless deleted longer than
    ``skip_wait_for_delete_timeout_s`` (> 0) ago (an unreadable deletionTimestamp counts as recent)."""
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
    """EVICT Succeeded and Failed pods, noting their phase; the later filters let them through, as kubectl does."""
    if is_finished(pod):
        return FilterStatus(Verdict.EVICT, f"finished: {_mapping(pod.get('status')).get('phase')}")
    return OK


def local_storage_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """Running pods with an emptyDir volume: EVICT with a warning with ``delete_emptydir_data``, else ERROR."""
    if not has_local_storage(pod) or is_finished(pod):
        return OK
    if options.delete_emptydir_data:
        return FilterStatus(Verdict.EVICT, "local-storage: uses emptyDir (its data is deleted)")
    return FilterStatus(
        Verdict.ERROR,
        "local-storage: cannot delete Pods with local storage (set DELETE_LOCAL_DATA=true to delete their emptyDir)",
    )


def unreplicated_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """Running pods without a controller: EVICT with a warning with ``force``, else ERROR."""
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
    """One :class:`PodDecision` per pod, in input order, by :data:`FILTERS`; ``now`` (naive means UTC; default: now) is
    what deletionTimestamps are compared with. Never raises on a pod."""
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return DrainPlan(tuple(_decide(pod, options, now) for pod in pods))
