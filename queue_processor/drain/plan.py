"""A drain's plan and its timing, pure but for :class:`DrainBounds`: which pods go in which wave with which grace.

kubectl's filters (:mod:`~queue_processor.drain.filters`) choose the pods; DRAIN_ORDER=waves evicts *critical* pods
(:func:`is_critical`) once the others are gone or only their time is left, so log shippers, meshes and storage
daemons outlive their users ("Pod Priority and Preemption"). With a known instance end a grace period
(``deleteOptions.gracePeriodSeconds``, "API-initiated Eviction") is cut to end ``margin`` seconds before it, at
least 1 s (0 would be a forced deletion, which only the deadline step does).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, TypeVar

from queue_processor.config import Settings, default
from queue_processor.drain.filters import DrainOptions, PodDecision, controller_of, plan_drain, pod_key
from queue_processor.outcomes import EvictionOutcome

__all__ = [
    "CRITICAL_CLASSES",
    "DEFAULT_GRACE_S",
    "DRAIN_POLICY_ANNOTATION",
    "SYSTEM_CLUSTER_CRITICAL",
    "WAVE_PAD_S",
    "DrainBounds",
    "DrainOrder",
    "DrainPod",
    "DrainPolicy",
    "DrainTiming",
    "Eviction",
    "PolicyNotice",
    "WavePlan",
    "drain_policy",
    "granted_grace",
    "is_critical",
    "join_plans",
    "own_grace",
    "plan_waves",
    "wave_of",
    "waves",
    "workload_of",
]

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
    """The values of :data:`DRAIN_POLICY_ANNOTATION`."""

    EVICT = "evict"
    """The default: evicted in its wave (by priority with DRAIN_ORDER=waves)."""
    LAST = "last"
    """Evicted in the last wave, once the node's other pods are gone, whatever its priority or DRAIN_ORDER."""
    SURGE = "surge"
    """With SURGE_DRAINS, a Deployment's pod is evicted in its wave once a replacement is available
    (:mod:`queue_processor.drain.surge`); otherwise reported once per workload and evicted as ``evict``."""


def drain_policy(pod: Mapping[str, Any]) -> tuple[DrainPolicy, str | None]:
    """The pod's :class:`DrainPolicy` (blanks ignored), and the annotation's value when it names none (``EVICT``)."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(DRAIN_POLICY_ANNOTATION) if isinstance(annotations, Mapping) else None
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
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return "default/Pod/None"
    namespace = str(metadata.get("namespace") or "default")
    owners = metadata.get("ownerReferences")
    controllers = (
        [o for o in owners if isinstance(o, Mapping) and o.get("controller")]
        if isinstance(owners, list)
        else []
    )
    if not controllers:
        return f"{namespace}/Pod/{metadata.get('name')}"
    kind, name = str(controllers[0].get("kind")), str(controllers[0].get("name"))
    labels = metadata.get("labels")
    template_hash = labels.get("pod-template-hash") if isinstance(labels, Mapping) else None
    if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        return f"{namespace}/Deployment/{name.removesuffix(f'-{template_hash}')}"
    return f"{namespace}/{kind}/{name}"


def is_critical(pod: Mapping[str, Any], threshold: int = SYSTEM_CLUSTER_CRITICAL) -> bool:
    """Whether ``pod``'s priority class is in :data:`CRITICAL_CLASSES` or ``spec.priority`` ≥ ``threshold``."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    if spec.get("priorityClassName") in CRITICAL_CLASSES:
        return True
    priority = spec.get("priority")
    return isinstance(priority, int) and not isinstance(priority, bool) and priority >= threshold


def wave_of(pod: Mapping[str, Any], order: DrainOrder, threshold: int = SYSTEM_CLUSTER_CRITICAL) -> int:
    """The wave ``pod`` is evicted in: 1 when critical (with ``waves``) or annotated ``last``, else 0."""
    if drain_policy(pod)[0] is DrainPolicy.LAST:
        return 1
    return 1 if order is DrainOrder.WAVES and is_critical(pod, threshold) else 0


_T = TypeVar("_T")


def waves(
    items: Sequence[_T],
    order: DrainOrder,
    threshold: int = SYSTEM_CLUSTER_CRITICAL,
    *,
    pod_of: Callable[[_T], Mapping[str, Any]],
) -> list[list[_T]]:
    """``items`` split into non-empty waves in eviction order, input order kept; ``pod_of`` gives an item's pod."""
    split: list[list[_T]] = [[], []]
    for item in items:
        split[wave_of(pod_of(item), order, threshold)].append(item)
    return [wave for wave in split if wave]


def own_grace(pod: Mapping[str, Any], override_s: int = -1) -> int:
    """The grace (seconds) for ``pod`` without a deadline: ``override_s`` (POD_TERMINATION_GRACE_PERIOD) when
    ≥ 0, else its ``terminationGracePeriodSeconds`` (:data:`DEFAULT_GRACE_S` when absent or mistyped)."""
    if override_s >= 0:
        return override_s
    spec = pod.get("spec")
    value = spec.get("terminationGracePeriodSeconds") if isinstance(spec, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return DEFAULT_GRACE_S


def granted_grace(own_s: int, until_end_s: float | None, margin_s: float) -> tuple[int, bool]:
    """The grace to ask for (seconds) and whether it was cut: ``own_s`` cut to end ``margin_s`` before the instance's
    end (``until_end_s`` from now; ``None``: unknown, no cut; negative ``margin_s``: no cut), a cut one at least 1 s."""
    if until_end_s is None or margin_s < 0:
        return own_s, False
    room = max(1, math.floor(until_end_s - margin_s))
    if own_s <= room:
        return own_s, False
    return room, True


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
        """The timing the settings ask for."""
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
    granted_s: int | None = None
    cut: bool = False
    surge: str | None = None
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PolicyNotice:
    """A pod whose ``queue-processor/drain`` annotation ``value`` cannot be followed, its ``workload``, and
    ``why``: ``unknown`` policy, ``surge-off`` (no SURGE_DRAINS) or ``cannot-surge`` (not a Deployment's pod)."""

    namespace: str
    name: str
    workload: str
    value: str
    why: Literal["unknown", "surge-off", "cannot-surge"] = "unknown"


@dataclass(frozen=True)
class WavePlan:
    """What a drain will do (:func:`plan_waves`): the pods of each wave, those the filters skip or refuse
    (``refused``: the drain cannot start), and the policy ``notices`` to report."""

    waves: list[list[DrainPod]]
    skipped: list[PodDecision]
    refused: list[PodDecision]
    notices: list[PolicyNotice] = field(default_factory=list)


def plan_waves(
    pods: list[dict[str, Any]], options: DrainOptions, timing: DrainTiming, grace_s: int
) -> WavePlan:
    """The plan of a drain of ``pods``, each pod's grace ``grace_s`` (-1: its own); names, no pod objects."""
    decisions = plan_drain(pods, options)
    evicting = {id(pod) for pod in decisions.evict}
    entries = [
        DrainPod(
            key=pod_key(pod),
            uid=pod["metadata"].get("uid"),
            grace_s=own_grace(pod, grace_s),
            evict=id(pod) in evicting,
            owner=_owner_uid(pod),
        )
        for pod in decisions.wait_for
    ]
    groups = waves(
        list(zip(entries, decisions.wait_for, strict=True)),
        timing.order,
        timing.critical_priority,
        pod_of=lambda item: item[1],
    )
    notices = []
    for entry, pod in zip(entries, decisions.wait_for, strict=True):
        policy, unknown = drain_policy(pod)
        namespace, name = pod_key(pod)
        workload = workload_of(pod)
        if unknown is not None:
            notices.append(PolicyNotice(namespace, name, workload, unknown))
        elif policy is DrainPolicy.SURGE and entry.evict:
            kind, _, deployment = workload.split("/", 1)[1].partition("/")
            if not timing.surge:
                notices.append(PolicyNotice(namespace, name, workload, policy.value, "surge-off"))
            elif kind != "Deployment":
                notices.append(PolicyNotice(namespace, name, workload, policy.value, "cannot-surge"))
            else:
                entry.surge, entry.labels = deployment, dict(pod["metadata"].get("labels") or {})
    return WavePlan(
        waves=[[entry for entry, _ in group] for group in groups],
        skipped=[replace(decision, pod={}) for decision in decisions.skipped],
        refused=[replace(decision, pod={}) for decision in decisions.errors],
        notices=notices,
    )


def _owner_uid(pod: Mapping[str, Any]) -> str | None:
    """The uid of the pod's controller owner, interned (the pods of one workload share it), or ``None``."""
    owner = controller_of(pod)
    uid = None if owner is None else owner.get("uid")
    return sys.intern(uid) if isinstance(uid, str) and uid else None


def join_plans(first: WavePlan, later: WavePlan) -> WavePlan:
    """The plans of two passes of one drain as one: wave by wave, then what each left alone or refused."""
    count = max(len(first.waves), len(later.waves))
    waves = [
        (first.waves[i] if i < len(first.waves) else []) + (later.waves[i] if i < len(later.waves) else [])
        for i in range(count)
    ]
    return WavePlan(
        waves, first.skipped + later.skipped, first.refused + later.refused, first.notices + later.notices
    )


class DrainBounds:
    """When a drain must end, only ever tightened (DESIGN.md rule 13): ``deadline`` and ``instance_end`` (``clock``
    readings; ``None``: unknown). A :meth:`tighten` wakes the drain's waits at once, to re-cut and re-plan. One loop."""

    def __init__(self, deadline: float, instance_end: float | None = None) -> None:
        self.deadline = deadline
        self.instance_end = instance_end
        self.version = 0
        """How many times the bounds tightened."""
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
        """Wait until the bounds tighten next."""
        await self._tightened.wait()


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
