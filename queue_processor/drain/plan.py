"""A drain's plan, pure but for :class:`DrainBounds`: which pods go, in which wave, with which grace.
kubectl-drain's pod filters (``k8s.io/kubectl/pkg/drain``) over API JSON dicts (a mistyped field counts as absent),
except that DaemonSet pods are never evicted, terminating ones only waited for, and warnings kept. DRAIN_ORDER=waves
evicts *critical* pods ("Pod Priority and Preemption") last. With a known instance end a grace
(``deleteOptions.gracePeriodSeconds``, "API-initiated Eviction") is cut to end ``margin`` seconds before it, ≥ 1 s."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from queue_processor.config import Settings, default
from queue_processor.outcomes import EvictionOutcome

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
"""Annotation the kubelet puts on a static pod's API mirror ("Static Pods")."""


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
    def skipped(self) -> list[PodDecision]:
        """The decisions of pods the drain leaves alone (own, mirror, DaemonSet-managed, terminating)."""
        return [d for d in self.decisions if d.verdict is Verdict.SKIP]

    @property
    def errors(self) -> list[PodDecision]:
        return [d for d in self.decisions if d.verdict is Verdict.ERROR]


@dataclass(frozen=True)
class FilterStatus:
    """One filter's ``verdict`` on a pod, its ``message`` (a warning on an EVICT) and ``awaiting_deletion``."""

    verdict: Verdict
    message: str = ""
    awaiting_deletion: bool = False


OK = FilterStatus(Verdict.EVICT)


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


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return _metadata(pod).get("deletionTimestamp") is not None


def is_finished(pod: Mapping[str, Any]) -> bool:
    phase = _mapping(pod.get("status")).get("phase")
    return phase in ("Succeeded", "Failed")


#: The reason :func:`own_pod_filter` gives: the handler evicts that pod itself, last, once the rest is drained.
OWN_POD = "own-pod"


def own_pod_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """SKIP the controller's own pod (``options.own_pod``): the handler evicts it last, once the node is drained."""
    if options.own_pod is not None and pod_key(pod) == tuple(options.own_pod):
        return FilterStatus(Verdict.SKIP, OWN_POD)
    return OK


def mirror_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """SKIP mirror pods (:data:`MIRROR_POD_ANNOTATION`): the kubelet owns them; the API server cannot delete them."""
    if MIRROR_POD_ANNOTATION in _mapping(_metadata(pod).get("annotations")):
        return FilterStatus(Verdict.SKIP, "mirror: mirror (static) pod")
    return OK


def daemonset_filter(pod: Mapping[str, Any], options: DrainOptions, now: datetime) -> FilterStatus:
    """DaemonSet-managed pods: SKIP with ``ignore_daemonsets``, else ERROR; a finished one is always SKIP. The
    DaemonSet controller ignores unschedulable nodes and would recreate an evicted pod at once ("DaemonSet")."""
    controller = controller_of(pod)
    if controller is None or controller.get("kind") != "DaemonSet":
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
    """Pods being deleted: SKIP, waited for unless readably deleted > ``skip_wait_for_delete_timeout_s`` (> 0) ago."""
    deleted = _metadata(pod).get("deletionTimestamp")
    if deleted is None:
        return OK
    if isinstance(deleted, str):
        with contextlib.suppress(ValueError):
            deleted = datetime.fromisoformat(deleted)
    timeout = options.skip_wait_for_delete_timeout_s
    if timeout > 0 and isinstance(deleted, datetime):
        age = now - (deleted if deleted.tzinfo is not None else deleted.replace(tzinfo=UTC))  # naive: UTC
        if age.total_seconds() > timeout:
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
    """Running pods with an ``emptyDir`` volume: EVICT with a warning with ``delete_emptydir_data``, else ERROR."""
    volumes = _items(_mapping(pod.get("spec")).get("volumes"))
    if is_finished(pod) or not any(volume.get("emptyDir") is not None for volume in volumes):
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


FILTERS: tuple[Callable[[Mapping[str, Any], DrainOptions, datetime], FilterStatus], ...] = (
    own_pod_filter,
    mirror_filter,
    daemonset_filter,
    terminating_filter,
    finished_filter,
    local_storage_filter,
    unreplicated_filter,
)
"""The filters (pure, never raise) in the order :func:`plan_drain` runs them; the first not saying EVICT decides."""


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
    """One :class:`PodDecision` per pod, in order, by :data:`FILTERS` at ``now`` (naive: UTC); never raises on a pod."""
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return DrainPlan(tuple(_decide(pod, options, now) for pod in pods))


#: spec.priority of the ``system-cluster-critical`` PriorityClass (``system-node-critical`` is 2000001000).
SYSTEM_CLUSTER_CRITICAL = 2_000_000_000

#: The PriorityClasses Kubernetes creates, whose pods are critical whatever their spec.priority says.
CRITICAL_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})

#: A pod's terminationGracePeriodSeconds when its spec has none (the API server's default).
DEFAULT_GRACE_S = 30


class DrainOrder(StrEnum):
    """DRAIN_ORDER: ``waves`` (ordinary pods, then critical ones) or ``all-at-once`` (kubectl's, NTH's)."""

    WAVES = "waves"
    ALL_AT_ONCE = "all-at-once"


#: The pod annotation that chooses a pod's :class:`DrainPolicy` (through its workload's pod template).
DRAIN_POLICY_ANNOTATION = "queue-processor/drain"


class DrainPolicy(StrEnum):
    """The values of :data:`DRAIN_POLICY_ANNOTATION`: ``evict`` (the default, in its wave), ``last`` (in the last
    wave whatever its priority or DRAIN_ORDER), ``surge`` (with SURGE_DRAINS, a Deployment's pod once a replacement is
    available, :mod:`~queue_processor.drain.surge`; otherwise reported once per workload and evicted as ``evict``)."""

    EVICT = "evict"
    LAST = "last"
    SURGE = "surge"


def drain_policy(pod: Mapping[str, Any]) -> tuple[DrainPolicy, str | None]:
    """The pod's :class:`DrainPolicy` (blanks ignored), and the annotation's value when it names none (``EVICT``)."""
    value = _mapping(_metadata(pod).get("annotations")).get(DRAIN_POLICY_ANNOTATION)
    if value is None:
        return DrainPolicy.EVICT, None
    text = str(value).strip()
    try:
        return DrainPolicy(text), None
    except ValueError:
        return DrainPolicy.EVICT, text


def workload_of(pod: Mapping[str, Any]) -> str:
    """``namespace/Kind/name`` of the pod's controller owner (a ReplicaSet ``<deployment>-<pod-template-hash>``
    counts as its Deployment), or ``namespace/Pod/name`` without one. Never raises."""
    metadata, controller = _metadata(pod), controller_of(pod)
    namespace = str(metadata.get("namespace") or "default")
    if controller is None:
        return f"{namespace}/Pod/{metadata.get('name')}"
    kind, name = str(controller.get("kind")), str(controller.get("name"))
    template_hash = _mapping(metadata.get("labels")).get("pod-template-hash")
    if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        return f"{namespace}/Deployment/{name.removesuffix(f'-{template_hash}')}"
    return f"{namespace}/{kind}/{name}"


def wave_of(pod: Mapping[str, Any], order: DrainOrder, threshold: int = SYSTEM_CLUSTER_CRITICAL) -> int:
    """The wave ``pod`` is evicted in: 1 when annotated ``last`` or, with ``waves``, critical (its priority class in
    :data:`CRITICAL_CLASSES` or ``spec.priority`` ≥ ``threshold``), else 0."""
    if drain_policy(pod)[0] is DrainPolicy.LAST:
        return 1
    spec = _mapping(pod.get("spec"))
    priority = spec.get("priority")
    high = isinstance(priority, int) and not isinstance(priority, bool) and priority >= threshold
    critical = high or spec.get("priorityClassName") in CRITICAL_CLASSES
    return 1 if order is DrainOrder.WAVES and critical else 0


def own_grace(pod: Mapping[str, Any], override_s: int = -1) -> int:
    """The grace (seconds) without a deadline: ``override_s`` if ≥ 0, else ``terminationGracePeriodSeconds`` (or 30)."""
    if override_s >= 0:
        return override_s
    value = _mapping(pod.get("spec")).get("terminationGracePeriodSeconds")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return DEFAULT_GRACE_S


#: Seconds added to the longest grace of the waves still to come, when a wave's wait is cut short for them.
WAVE_PAD_S = 2.0

_DEFAULT_ORDER = DrainOrder(default("drain_order"))


@dataclass(frozen=True)
class DrainTiming:
    """How a drain evicts, a field per setting (seconds): ``order`` DRAIN_ORDER, ``critical_priority``
    DRAIN_CRITICAL_PRIORITY, ``grace_margin_s`` GRACE_DEADLINE_MARGIN (negative: never cut), ``surge`` SURGE_DRAINS,
    ``delete_at_deadline``/``delete_lead_s`` DELETE_AT_DEADLINE[_LEAD], ``relist_s`` DRAIN_RELIST_AFTER (0: never)."""

    order: DrainOrder = _DEFAULT_ORDER
    critical_priority: int = default("drain_critical_priority")
    grace_margin_s: float = default("grace_deadline_margin")
    delete_at_deadline: bool = default("delete_at_deadline")
    delete_lead_s: float = default("delete_at_deadline_lead")
    surge: bool = default("surge_drains")
    relist_s: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> DrainTiming:
        return cls(
            order=DrainOrder(settings.drain_order),
            critical_priority=settings.drain_critical_priority,
            grace_margin_s=settings.grace_deadline_margin,
            delete_at_deadline=settings.delete_at_deadline,
            delete_lead_s=settings.delete_at_deadline_lead,
            surge=settings.surge_drains,
            relist_s=settings.drain_relist_after,
        )


@dataclass
class DrainPod:
    """One pod of a drain, with its controller owner's uid (the key of :attr:`Evictions.gates`) and surge Deployment."""

    key: tuple[str, str]
    uid: Any
    grace_s: int
    evict: bool
    owner: str | None = None
    surge: str | None = None
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PolicyNotice:
    """A pod whose drain policy ``value`` cannot be followed: ``why`` ``unknown``, ``surge-off`` or ``cannot-surge``."""

    namespace: str
    name: str
    workload: str
    value: str
    why: str = "unknown"


@dataclass(frozen=True)
class WavePlan:
    """What :func:`plan_waves` plans: each wave's pods, those skipped or ``refused`` (no drain), policy ``notices``."""

    waves: list[list[DrainPod]]
    skipped: list[PodDecision]
    refused: list[PodDecision]
    notices: list[PolicyNotice] = field(default_factory=list)


def plan_waves(
    pods: list[dict[str, Any]], options: DrainOptions, timing: DrainTiming, grace_s: int
) -> WavePlan:
    """The plan of a drain of ``pods``, each pod's grace ``grace_s`` (-1: its own); names, no pod objects."""
    decisions = plan_drain(pods, options)
    split: list[list[DrainPod]] = [[], []]
    notices = []
    for decision in decisions.decisions:
        pod, evict = decision.pod, decision.verdict is Verdict.EVICT
        if not evict and not decision.awaiting_deletion:
            continue
        entry = DrainPod(
            (decision.namespace, decision.name), pod["metadata"].get("uid"), own_grace(pod, grace_s), evict
        )
        owner = controller_of(pod)
        uid = None if owner is None else owner.get("uid")
        entry.owner = sys.intern(uid) if isinstance(uid, str) and uid else None  # one string per workload
        split[wave_of(pod, timing.order, timing.critical_priority)].append(entry)
        policy, unknown = drain_policy(pod)
        workload = workload_of(pod)
        kind, _, deployment = workload.split("/", 1)[1].partition("/")
        why = "unknown" if unknown is not None else None
        if policy is DrainPolicy.SURGE and evict and timing.surge and kind == "Deployment":
            entry.surge, entry.labels = deployment, dict(pod["metadata"].get("labels") or {})
        elif policy is DrainPolicy.SURGE and evict:
            why = "cannot-surge" if timing.surge else "surge-off"
        if why is not None:
            value = policy.value if unknown is None else unknown
            notices.append(PolicyNotice(decision.namespace, decision.name, workload, value, why))
    return WavePlan(
        waves=[wave for wave in split if wave],
        skipped=[replace(decision, pod={}) for decision in decisions.skipped],
        refused=[replace(decision, pod={}) for decision in decisions.errors],
        notices=notices,
    )


def join_plans(first: WavePlan, later: WavePlan) -> WavePlan:
    """The plans of two passes of one drain as one: wave by wave, then what each left alone or refused."""
    none: list[DrainPod] = []
    waves = [a + b for a, b in itertools.zip_longest(first.waves, later.waves, fillvalue=none)]
    return WavePlan(
        waves, first.skipped + later.skipped, first.refused + later.refused, first.notices + later.notices
    )


class DrainBounds:
    """A drain's ``deadline`` and ``instance_end`` (clock readings; ``None``: unknown), only tightened (DESIGN.md rule
    13); :meth:`tighten` wakes the drain's waits to re-cut and re-plan."""

    def __init__(self, deadline: float, instance_end: float | None = None) -> None:
        self.deadline = deadline
        self.instance_end = instance_end
        self.version = 0  # how many times the bounds tightened
        self._tightened = asyncio.Event()

    def tighten(self, deadline: float, instance_end: float | None) -> bool:
        """Take the nearer of each bound; ``True`` (and every waiter woken) when one moved."""
        moved = False
        if deadline < self.deadline:
            self.deadline, moved = deadline, True
        if instance_end is not None and (self.instance_end is None or instance_end < self.instance_end):
            self.instance_end, moved = instance_end, True
        if moved:
            self.version += 1
            woken, self._tightened = self._tightened, asyncio.Event()
            woken.set()
        return moved

    def final(self, timing: DrainTiming) -> tuple[float, bool]:
        """The last moment the drain waits for (a ``clock`` reading) and whether the deadline step ends it: with
        DELETE_AT_DEADLINE, DELETE_AT_DEADLINE_LEAD before the instance's end if that precedes the deadline."""
        end = self.instance_end
        if timing.delete_at_deadline and end is not None and end - timing.delete_lead_s <= self.deadline:
            return end - timing.delete_lead_s, True
        return self.deadline, False

    async def sleep(self, seconds: float, *, wake: asyncio.Event | None = None) -> bool:
        """Wait ``seconds``, less if the bounds tighten (or ``wake`` is set); ``True`` when they tightened."""
        tightened = self._tightened
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                if wake is None:
                    await tightened.wait()
                else:
                    waits = [asyncio.ensure_future(tightened.wait()), asyncio.ensure_future(wake.wait())]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for task in waits:
                            task.cancel()
        return tightened.is_set()

    async def tightening(self) -> None:
        await self._tightened.wait()

    def grace(self, own_s: int, timing: DrainTiming, now: float) -> tuple[int, bool]:
        """The grace to ask for at ``now`` (a ``clock`` reading) and whether it was cut: ``own_s`` (seconds) cut to end
        GRACE_DEADLINE_MARGIN before the instance's end (unknown or a negative margin: no cut), a cut one ≥ 1 s."""
        if self.instance_end is None or timing.grace_margin_s < 0:
            return own_s, False
        room = max(1, math.floor(self.instance_end - now - timing.grace_margin_s))
        return (own_s, False) if own_s <= room else (room, True)

    def fixed(self, compute: Callable[[], float]) -> Callable[[], float]:
        """``compute`` computed once per version of the bounds (a wait polling it does not move it)."""

        @functools.lru_cache(maxsize=1)
        def at(version: int) -> float:
            return compute()

        return lambda: at(self.version)


@dataclass(frozen=True)
class Eviction:
    """How one pod's eviction ended: outcome, detail, last refusing budget, grace given and when (``clock``)."""

    key: tuple[str, str]
    result: EvictionOutcome
    detail: str
    budget: str | None = None
    grace_s: int | None = None
    cut: bool = False
    at: float = 0.0
