"""A drain's plan, pure: which pods go in which wave with which grace (kubectl's filters, then the order of
:mod:`queue_processor.drain.order`), and the drain timing the settings ask for."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from queue_processor.config import Settings, default
from queue_processor.drain.filters import DrainOptions, PodDecision, controller_of, plan_drain, pod_key
from queue_processor.drain.order import DrainOrder, DrainPolicy, drain_policy, own_grace, waves, workload_of

#: Seconds added to the longest grace of the waves still to come, when a wave's wait is cut short for them.
WAVE_PAD_S = 2.0

_DEFAULT_ORDER = DrainOrder(default("drain_order"))


@dataclass(frozen=True)
class DrainTiming:
    """When and in which order a drain evicts (:mod:`queue_processor.drain.order`), a field per setting: ``order``
    DRAIN_ORDER, ``critical_priority`` DRAIN_CRITICAL_PRIORITY, ``grace_margin_s`` GRACE_DEADLINE_MARGIN (negative:
    never cut), ``delete_at_deadline`` DELETE_AT_DEADLINE, ``delete_lead_s`` DELETE_AT_DEADLINE_LEAD, ``surge``
    SURGE_DRAINS, ``relist_s`` DRAIN_RELIST_AFTER (0: never, also without settings); times in seconds."""

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
    """The plan of a drain of ``pods`` (pure), with each pod's grace (``grace_s``; -1: its own); names, no pod
    objects."""
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
