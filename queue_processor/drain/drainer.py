"""Cordon, taint, label and drain one node, with kubectl-drain semantics ("Safely Drain a Node").

List the node's pods once, filter them (:func:`~queue_processor.drain.filters.plan_drain`), evict the chosen ones in
parallel through the policy/v1 Eviction API ("API-initiated Eviction": 429 retried, 500 fails the pod, 404 is gone),
then wait until they are gone or the deadline. DRAIN_BUDGET bounds the nodes drained at once; cordons never wait for
it. One code path whatever USE_APISERVER_CACHE says (DESIGN.md rule 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import structlog

from queue_processor import tasks
from queue_processor.config import Settings, default
from queue_processor.drain.budgets import budget_arithmetic, budget_of
from queue_processor.drain.filters import DrainOptions, PodDecision, controller_of, plan_drain, pod_key
from queue_processor.drain.gates import BudgetGates
from queue_processor.drain.order import (
    DRAIN_POLICY_ANNOTATION,
    DrainOrder,
    DrainPolicy,
    drain_policy,
    granted_grace,
    own_grace,
    waves,
    workload_of,
)
from queue_processor.drain.record import RECORD_ANNOTATION, RECORD_LABEL, CordonRecord, recorded, undo_patch
from queue_processor.drain.slots import LEAST_SLOTS, Slot, Slots
from queue_processor.drain.surge import SURGE_LEAST_S, Surge, Surges
from queue_processor.kube import KubeClient, NotSentError
from queue_processor.observe.events import SURGE_NOT_POSSIBLE, UNKNOWN_DRAIN_POLICY
from queue_processor.observe.observer import NULL_OBSERVER, Observer
from queue_processor.outcomes import ClaimLost, DrainOutcome, EvictionOutcome, KubeError, SurgeResult
from queue_processor.watch.departures import Departures, Ticket, Waiting
from queue_processor.watch.node_cache import FIRST_COPY_WAIT_S, NodeCache

__all__ = [
    "LOOKED_AGAIN",
    "TAINT_WRITE_ATTEMPTS",
    "WAVE_PAD_S",
    "WAVE_TIME_UP",
    "DrainBounds",
    "DrainResult",
    "DrainTiming",
    "Drainer",
]

#: Logged for the pods a drain's second list found (``pods``); they go after every pod of the first list.
LOOKED_AGAIN = "looked again: pods bound to the node after its first list"

#: Logged when a wave's time is up with its ``pods`` still on the node (``wave`` from 1): the next one starts.
WAVE_TIME_UP = "a wave's time is up: the next wave starts with pods of it still on the node"

#: Attempts of a node write, each on a fresh read after a 409 Conflict.
TAINT_WRITE_ATTEMPTS = 8

#: kubectl waits 5 s before retrying an eviction a PodDisruptionBudget refused; we start lower and back off.
EVICTION_RETRY_S = (1.0, 10.0)

#: Seconds added to the longest grace of the waves still to come, when a wave's wait is cut short for them.
WAVE_PAD_S = 2.0


@dataclass
class DrainResult:
    """How a drain ended: ``completed`` when every pod to evict is gone, else ``reason``; ``outcome`` says which. Pod
    counts: ``evicted`` (``cut_short`` with a cut grace), ``blocked`` (by a budget to the end), ``failed``,
    ``skipped`` (by the filters), ``finished_grace``/``outlasted`` (:func:`grace_verdicts`), ``deleted_at_deadline``,
    ``remaining``; ``waves``: pods per wave; ``causes``; ``drain_id``: its evictions' ``drain/<id>`` User-Agent."""

    completed: bool
    outcome: DrainOutcome = DrainOutcome.TIMEOUT
    reason: str | None = None
    evicted: int = 0
    blocked: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[PodDecision] = field(default_factory=list)
    remaining: int = 0
    cut_short: int = 0
    finished_grace: int = 0
    outlasted: int = 0
    deleted_at_deadline: int = 0
    waves: list[int] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    drain_id: str = ""


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


log = structlog.get_logger("queue_processor.drain")


class DrainBounds:
    """When a drain must end, only ever tightened (DESIGN.md rule 13): ``deadline`` and ``instance_end`` (``clock``
    readings; ``None``: unknown). The running drain picks up a :meth:`tighten` at once: waits wake, graces are cut
    again, waves and the deadline step re-planned. One asyncio loop owns it."""

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


@dataclass
class _Pod:
    """One pod of a drain, with its controller owner's uid (the key of :attr:`Drainer.gates`) and surge Deployment."""

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
class _Eviction:
    """How one pod's eviction ended: outcome, detail, last refusing budget, grace given and when (``clock``)."""

    key: tuple[str, str]
    result: EvictionOutcome
    detail: str
    budget: str | None = None
    grace_s: int | None = None
    cut: bool = False
    at: float = 0.0


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

    waves: list[list[_Pod]]
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
        _Pod(
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


Grace = Literal["own", "cut", "outlasted"]


def grace_verdicts(
    outcomes: list[_Eviction], left: Mapping[tuple[str, str], Any], instance_end: float | None
) -> dict[tuple[str, str], Grace]:
    """How each evicted pod's grace went (pure): ``cut``, ``own`` (all of it before the instance's end, or, that
    unknown, gone by the drain's end) or ``outlasted`` (killed mid-grace when the instance goes)."""
    verdicts: dict[tuple[str, str], Grace] = {}
    for outcome in outcomes:
        if outcome.result is not EvictionOutcome.EVICTED or outcome.grace_s is None:
            continue
        if outcome.cut:
            verdicts[outcome.key] = "cut"
        elif instance_end is not None:
            verdicts[outcome.key] = "own" if outcome.at + outcome.grace_s <= instance_end else "outlasted"
        elif outcome.key not in left:
            verdicts[outcome.key] = "own"
    return verdicts


@dataclass
class _Done:
    """What a drain's execution saw (evictions with re-cuts, grace verdicts, counts, causes)."""

    outcomes: list[_Eviction] = field(default_factory=list)
    graces: dict[tuple[str, str], Grace] = field(default_factory=dict)
    remaining: int = 0
    deleted: int = 0
    causes: list[str] = field(default_factory=list)

    def joined(self, later: _Done) -> _Done:
        """What two passes of one drain saw, together."""
        return _Done(
            self.outcomes + later.outcomes,
            {**self.graces, **later.graces},
            self.remaining + later.remaining,
            self.deleted + later.deleted,
            self.causes + later.causes,
        )


def _finished(done: _Done) -> bool:
    """Whether a pass ended with every pod gone and no eviction failed."""
    return not done.remaining and not any(o.result is EvictionOutcome.ERROR for o in done.outcomes)


def _joined(first: WavePlan, later: WavePlan) -> WavePlan:
    """The plans of two passes of one drain as one: wave by wave, then what each left alone or refused."""
    count = max(len(first.waves), len(later.waves))
    waves = [
        (first.waves[i] if i < len(first.waves) else []) + (later.waves[i] if i < len(later.waves) else [])
        for i in range(count)
    ]
    return WavePlan(
        waves, first.skipped + later.skipped, first.refused + later.refused, first.notices + later.notices
    )


def summarise(planned: WavePlan, done: _Done, drain_id: str) -> DrainResult:
    """The :class:`DrainResult` of a drain (pure): built once, from its plan and what its execution saw."""
    waves = [len(wave) for wave in planned.waves]
    if planned.refused:
        names = ", ".join(f"{d.namespace}/{d.name} ({d.reason})" for d in planned.refused)
        return DrainResult(
            completed=False,
            outcome=DrainOutcome.ERROR,
            reason=f"cannot drain: {names}",
            skipped=planned.skipped,
            causes=[f"the drain filters refuse {names}"],
            drain_id=drain_id,
        )
    evicted = [o for o in done.outcomes if o.result is EvictionOutcome.EVICTED]
    failed = [
        f"{o.key[0]}/{o.key[1]}: {o.detail}" for o in done.outcomes if o.result is EvictionOutcome.ERROR
    ]
    finished = not (done.remaining or failed)
    if failed:
        outcome = DrainOutcome.ERROR
    elif done.remaining:
        outcome = DrainOutcome.TIMEOUT
    else:
        outcome = DrainOutcome.DELETED if done.deleted else DrainOutcome.DRAINED
    verdicts = list(done.graces.values())
    return DrainResult(
        completed=finished,
        outcome=outcome,
        reason=None if finished else "; ".join(done.causes),
        evicted=len(evicted),
        blocked=sum(1 for o in done.outcomes if o.result is EvictionOutcome.PDB_BLOCKED),
        failed=failed,
        skipped=planned.skipped,
        remaining=done.remaining,
        cut_short=sum(1 for o in evicted if o.cut),
        finished_grace=verdicts.count("own"),
        outlasted=verdicts.count("outlasted"),
        deleted_at_deadline=done.deleted,
        waves=waves,
        causes=done.causes,
        drain_id=drain_id,
    )


class Drainer:
    """Node operations through a :class:`KubeClient`: ``budget`` is DRAIN_BUDGET, ``grace_s``
    POD_TERMINATION_GRACE_PERIOD, ``use_cache`` USE_APISERVER_CACHE; ``clock`` returns monotonic seconds."""

    def __init__(
        self,
        kube: KubeClient,
        options: DrainOptions,
        *,
        budget: int,
        grace_s: int = default("pod_termination_grace_period"),
        use_cache: bool = False,
        timing: DrainTiming = DrainTiming(),
        observer: Observer = NULL_OBSERVER,
        clock: Callable[[], float] = time.monotonic,
        departures: Departures | None = None,
        nodes: NodeCache | None = None,
        evictions_in_flight: int = LEAST_SLOTS,
    ) -> None:
        self.kube = kube
        self.slots = Slots(evictions_in_flight)
        """Evictions waiting for their first answer at once, across drains
        (:func:`~queue_processor.drain.slots.evictions_in_flight`)."""
        self.nodes = nodes
        """The watched nodes a cordon writes on without reading the node first (``None``: a GET per cordon)."""
        self.departures = departures
        """The watch of pod deletions a drain waits on instead of re-listing (``None``: re-list)."""
        self.options = options
        self.budget = asyncio.Semaphore(budget)
        self.grace_s = grace_s
        self.use_cache = use_cache
        self.timing = timing
        self.observer = observer
        self.clock = clock
        self.draining = 0
        self.blocked: Counter[str] = Counter()
        """PodDisruptionBudget (``namespace/name``) → pods whose eviction it refuses now, across drains."""
        self.gates = BudgetGates()
        """Budgets that refused a moment ago; their workloads' pods wait (:mod:`~queue_processor.drain.gates`)."""
        self._reported: set[tuple[str, str]] = set()  # (workload, annotation value) reported already
        self.surges = Surges(kube)

    async def cordon(
        self,
        node: str,
        *,
        taints: Sequence[tuple[str, str, str]] = (),
        labels_if_absent: Mapping[str, str] | None = None,
        about: CordonRecord | None = None,
    ) -> bool:
        """Mark the node unschedulable and, in the same write, add ``taints`` (``(key, value, effect)``) and the
        ``labels_if_absent`` it lacks, recording the change in its
        :class:`~queue_processor.drain.record.CordonRecord` (with ``about``'s instance facts) for :meth:`undo`.
        Idempotent. ``spec.taints`` has no patch merge key, so this is a read-modify-write on the read
        ``resourceVersion``; a 409 is retried on a fresh read (:data:`TAINT_WRITE_ATTEMPTS`). ``False`` when the node
        does not exist; raises :class:`KubeError` otherwise."""
        patch: dict[str, Any] = {"spec": {"unschedulable": True}}
        try:
            await self._read_modify_write(node, taints, patch, labels_if_absent or {}, about)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def taint(
        self, node: str, key: str, value: str, effect: str, *, about: CordonRecord | None = None
    ) -> None:
        """Add (or update) one taint, keeping the others, as :meth:`cordon`; recorded with ``about``'s instance
        facts when new. Raises :class:`KubeError` (404: the node is gone)."""
        await self._read_modify_write(node, [(key, value, effect)], {}, {}, about)

    async def undo(self, node: str, decide: Callable[[dict[str, Any], CordonRecord], bool]) -> bool:
        """Take back what the node's :class:`~queue_processor.drain.record.CordonRecord` says we changed, if
        ``decide(node, record)`` agrees: ``True`` when undone, ``False`` when the node is gone, has no record or
        ``decide`` declined. A 409 is retried as in :meth:`cordon`; raises :class:`KubeError` otherwise."""
        for attempt in range(TAINT_WRITE_ATTEMPTS):
            current = await self.kube.get_node(node)
            record = CordonRecord.from_node(current) if current is not None else None
            if current is None or record is None or not decide(current, record):
                return False
            try:
                await self.kube.patch_node(node, undo_patch(current, record))
                return True
            except KubeError as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409 or attempt == TAINT_WRITE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        return False  # pragma: no cover - the loop returns or raises

    async def _read_modify_write(
        self,
        node: str,
        taints: Sequence[tuple[str, str, str]],
        patch: dict[str, Any],
        labels_if_absent: Mapping[str, str],
        about: CordonRecord | None = None,
    ) -> None:
        ours = [{"key": key, "value": value[:63], "effect": effect} for key, value, effect in taints]
        identities = {(taint["key"], taint["effect"]) for taint in ours}
        for attempt in range(TAINT_WRITE_ATTEMPTS):
            # First attempt: the watched copy, no read (a stale copy answers 409 and the next attempt reads).
            if attempt == 0 and self.nodes is not None:
                await self.nodes.first_answer(FIRST_COPY_WAIT_S)  # at start-up: the copy, not a GET per node
            current = self.nodes.get(node) if attempt == 0 and self.nodes is not None else None
            if current is None:
                current = await self.kube.get_node(node)
            if current is None:
                raise KubeError(404, "NotFound", f'nodes "{node}" not found')
            kept = [
                taint
                for taint in (current.get("spec") or {}).get("taints") or []
                if (taint.get("key"), taint.get("effect")) not in identities
            ]
            present = (current.get("metadata") or {}).get("labels") or {}
            metadata: dict[str, Any] = {"resourceVersion": current["metadata"]["resourceVersion"]}
            labels = {key: value for key, value in labels_if_absent.items() if key not in present}
            spec = dict(patch.get("spec", {}))
            record = recorded(
                current,
                unschedulable=bool(spec.get("unschedulable")),
                taints=sorted(identities),
                labels=labels,
                about=about,
            )
            if record is not None:
                metadata["annotations"] = {RECORD_ANNOTATION: record.to_json()}
                labels = {**labels, RECORD_LABEL: "true"}
            if labels:
                metadata["labels"] = labels
            if taints:
                spec["taints"] = kept + ours
            body = {**patch, "metadata": metadata, "spec": spec}
            try:
                await self.kube.patch_node(node, body)
                return
            except KubeError as exc:
                if exc.status != 409 or attempt == TAINT_WRITE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))

    async def drain(
        self,
        node: str,
        deadline: float | DrainBounds,
        *,
        instance_end: float | None = None,
        guard: Callable[[], Awaitable[None]] | None = None,
        lost: Callable[[], bool] | None = None,
        evicted: Callable[[str, str], Awaitable[None]] | None = None,
        deleted: Callable[[str, str], Awaitable[None]] | None = None,
        noticed: Callable[[str, str, str, str], Awaitable[None]] | None = None,
    ) -> DrainResult:
        """Evict the node's pods and wait until they are gone or the deadline (a ``clock`` reading, or
        :class:`DrainBounds` that may tighten), after taking a drain-budget slot. ``guard`` is awaited before each
        eviction and raises to stop the drain (:meth:`queue_processor.leases.Claim.confirm`); with ``lost()`` true a
        stopped drain leaves its surges to the node's new owner. Callbacks, which must not raise: ``evicted`` and
        ``deleted(namespace, name)``, and ``noticed(namespace, name, reason, message)`` once per workload and value
        whose drain annotation cannot be followed. Raises :class:`KubeError` when the pods cannot be listed, and what
        ``guard`` raises."""
        bounds = deadline if isinstance(deadline, DrainBounds) else DrainBounds(deadline, instance_end)
        async with self.budget:
            self.draining += 1
            self.observer.draining(self.draining)
            try:
                return await self._drain(node, bounds, guard, lost, evicted, deleted, noticed)
            finally:
                self.draining -= 1
                self.observer.draining(self.draining)

    async def _drain(
        self,
        node: str,
        bounds: DrainBounds,
        guard: Callable[[], Awaitable[None]] | None,
        lost: Callable[[], bool] | None,
        evicted: Callable[[str, str], Awaitable[None]] | None,
        deleted: Callable[[str, str], Awaitable[None]] | None,
        noticed: Callable[[str, str, str, str], Awaitable[None]] | None = None,
    ) -> DrainResult:
        """Plan (pure), execute, look again (DRAIN_RELIST_AFTER), summarise (pure)."""
        drain_id = uuid.uuid4().hex[:12]
        execute = functools.partial(
            self._execute,
            node,
            bounds=bounds,
            guard=guard,
            evicted=evicted,
            deleted=deleted,
            drain_id=drain_id,
            lost=lost,
        )
        run = functools.partial(self._pass, node, execute, noticed)
        listed = self.clock()
        planned, done = await run(set(), self.use_cache)
        relist_s = self.timing.relist_s
        if relist_s > 0 and not planned.refused and _finished(done):
            # A pod the scheduler bound just before it saw the cordon shows up after the first list.
            await bounds.sleep(min(listed + relist_s, bounds.final(self.timing)[0]) - self.clock())
            seen = {(entry.key, entry.uid) for wave in planned.waves for entry in wave}
            # From the API server's watch cache: seconds after the cordon it has the binding, at no etcd read.
            later, more = await run(seen | {((d.namespace, d.name), None) for d in planned.skipped}, True)
            if any(later.waves):
                log.info(
                    LOOKED_AGAIN,
                    node=node,
                    pods=sorted(f"{e.key[0]}/{e.key[1]}" for wave in later.waves for e in wave),
                )
            planned, done = _joined(planned, later), _Done.joined(done, more)
        return summarise(planned, done, drain_id)

    async def _pass(
        self,
        node: str,
        execute: Callable[..., Awaitable[_Done]],
        noticed: Callable[[str, str, str, str], Awaitable[None]] | None,
        seen: set[tuple[tuple[str, str], Any]],
        cached: bool,
    ) -> tuple[WavePlan, _Done]:
        """List the node's pods (``cached``: ``resourceVersion=0``), and plan and ``execute`` those not ``seen``."""
        # Taken before the list: the watch then reports every deletion of a listed pod the list did not see.
        ticket = self.departures.ticket() if self.departures is not None and not cached else None
        pods = [
            pod
            for pod in await self.kube.pods_on_node(node, cached=cached)
            if (pod_key(pod), pod["metadata"].get("uid")) not in seen and (pod_key(pod), None) not in seen
        ]
        planned = plan_waves(pods, self.options, self.timing, self.grace_s)
        # Names, not pod objects, for the rest of the drain: many drains may wait at once.
        del pods
        if planned.refused or not any(planned.waves):
            return planned, _Done()
        await self._report(planned.notices, noticed)
        entries = {(entry.key, entry.uid) for wave in planned.waves for entry in wave}
        with self._following(entries, ticket) as following:
            done = await execute(planned=planned, following=following)
        return planned, done

    @contextlib.contextmanager
    def _following(
        self, entries: set[tuple[tuple[str, str], Any]], ticket: Ticket | None
    ) -> Iterator[Waiting | None]:
        """The drain's pods followed by the watch of deletions while it runs (``None`` without one)."""
        if self.departures is None:
            yield None
            return
        with self.departures.waiting(entries, ticket) as following:
            yield following

    async def _report(
        self, notices: list[PolicyNotice], noticed: Callable[[str, str, str, str], Awaitable[None]] | None
    ) -> None:
        """Warn and call ``noticed`` once per workload and value for a drain policy that cannot be followed."""
        for notice in notices:
            if (notice.workload, notice.value) in self._reported:
                continue
            self._reported.add((notice.workload, notice.value))
            known = ", ".join(policy.value for policy in DrainPolicy)
            problem, line = {
                "unknown": (
                    f"is not a drain policy ({known})",
                    "unknown drain policy: evicted as by default",
                ),
                "surge-off": ("needs SURGE_DRAINS=true", "surge drains are off: evicted as by default"),
                "cannot-surge": (
                    "is only for a Deployment's pods (a StatefulSet's replacement has the pod's name and "
                    "cannot run beside it)",
                    "cannot surge a pod that is not a Deployment's: evicted as by default",
                ),
            }[notice.why]
            message = (
                f"{DRAIN_POLICY_ANNOTATION}: {notice.value!r} {problem}: "
                f"the pods of {notice.workload} are evicted as by default"
            )
            log.warning(
                line, workload=notice.workload, pod=f"{notice.namespace}/{notice.name}", value=notice.value
            )
            if noticed is not None:
                reason = UNKNOWN_DRAIN_POLICY if notice.why == "unknown" else SURGE_NOT_POSSIBLE
                await noticed(notice.namespace, notice.name, reason, message)

    async def _execute(
        self,
        node: str,
        planned: WavePlan,
        bounds: DrainBounds,
        guard: Callable[[], Awaitable[None]] | None,
        evicted: Callable[[str, str], Awaitable[None]] | None,
        deleted: Callable[[str, str], Awaitable[None]] | None,
        drain_id: str,
        following: Waiting | None = None,
        *,
        lost: Callable[[], bool] | None = None,
    ) -> _Done:
        """Evict wave by wave, wait, take the deadline step if due; stopped, take surges back unless ``lost()``."""
        timing = self.timing
        launchers: list[asyncio.Task[None]] = []
        running = _Running(launchers)  # its evictions grow as each wave's launcher starts them
        accepted: dict[tuple[str, str], _Eviction] = {}  # evictions the API server took, as last given
        by_key = {entry.key: entry for wave in planned.waves for entry in wave}
        held: list[Surge] = []  # surges of this drain: taken back when it ends, if not before
        recut = tasks.spawn(self._recut(bounds, by_key, accepted, drain_id), name=f"recut-{node}")
        start = functools.partial(
            self._evict,
            bounds=bounds,
            guard=guard,
            evicted=evicted,
            accepted=accepted,
            drain_id=drain_id,
            held=held,
        )
        try:
            for index, wave in enumerate(planned.waves):
                _raise_failed(running)  # a wave's wait ended on a failure: no later wave starts
                before = launchers[-1] if launchers else None
                later = [entry for later_wave in planned.waves[index + 1 :] for entry in later_wave]
                # Planned once per bounds version: re-planned every poll it would keep pushing the next wave later.
                kept: dict[int, float] = {}

                def wave_bound(later: list[_Pod] = later, kept: dict[int, float] = kept) -> float:
                    if bounds.version not in kept:
                        final = bounds.final(timing)[0]
                        kept.clear()
                        kept[bounds.version] = final - self._reserve(later, final, bounds.instance_end)
                    return kept[bounds.version]

                launchers.append(
                    tasks.spawn(
                        self._launch(
                            [entry for entry in wave if entry.evict],
                            functools.partial(start, wave_by=wave_bound if later else None),
                            running,
                            guard,
                            before,
                        ),
                        name=f"evictions-{node}",
                        awaited=True,
                    )
                )
                if later:
                    behind = await self._wait_gone(
                        node, {(e.key, e.uid) for e in wave}, wave_bound, bounds, running, following
                    )
                    if behind and not any(_failed(task) for task in running):
                        names = sorted(f"{key[0]}/{key[1]}" for key, _ in behind)
                        log.info(WAVE_TIME_UP, node=node, wave=index + 1, pods=names)
            await _settled(running)
            waiting = {(entry.key, entry.uid) for entry in by_key.values()}
            final = lambda: bounds.final(timing)[0]  # noqa: E731
            left = dict(await self._wait_gone(node, waiting, final, bounds, following=following))
        except BaseException as exc:
            # One stop for all, so a second cancellation cannot leave evictions running (a cancelled launcher
            # starts nothing more). Surges stay when the Lease is lost: the node's new owner takes them over.
            await tasks.stop(*running)
            if not isinstance(exc, ClaimLost) and not (lost is not None and lost()):
                await self._take_back(held)
            raise
        finally:
            await tasks.stop(recut)
        outcomes = [accepted.get(ended.key, ended) for ended in running.outcomes()]  # re-cuts included
        for outcome in outcomes:
            by_key[outcome.key].granted_s, by_key[outcome.key].cut = outcome.grace_s, outcome.cut
        graces = grace_verdicts(outcomes, left, bounds.instance_end)
        for grace in graces.values():
            self.observer.pod_drained(grace)
        removed = 0
        refused: list[str] = []  # deletions at the deadline the API server refused
        if left and bounds.final(timing)[1]:
            left, removed, refused = await self._delete_at_deadline(left, deleted)
        await self._take_back(held)  # those whose pod was not evicted: kept until the deadline step
        blocked = [o for o in outcomes if o.result is EvictionOutcome.PDB_BLOCKED]
        failed = any(o.result is EvictionOutcome.ERROR for o in outcomes)
        stuck = [by_key[key] for key in left]
        causes = await self._causes(blocked, outcomes, stuck) + refused if blocked or failed or left else []
        return _Done(outcomes, graces, len(left), removed, causes)

    async def _take_back(self, held: list[Surge]) -> None:
        """End every surge of ``held`` not ended yet (one read each for those that were)."""
        for surge in held:
            await self.surges.end(surge)

    async def _recut(
        self,
        bounds: DrainBounds,
        pods: Mapping[tuple[str, str], _Pod],
        accepted: dict[tuple[str, str], _Eviction],
        drain_id: str,
    ) -> None:
        """On each tightening, evict again with a cut grace each evicted pod whose grace would outlast the new end."""
        while True:
            await bounds.tightening()
            end = bounds.instance_end
            if end is None:
                continue
            for key, outcome in list(accepted.items()):
                if outcome.result is not EvictionOutcome.EVICTED or outcome.grace_s is None:
                    continue
                grace, cut = granted_grace(pods[key].grace_s, end - self.clock(), self.timing.grace_margin_s)
                if not cut or self.clock() + grace >= outcome.at + outcome.grace_s:
                    continue
                with contextlib.suppress(KubeError):
                    await self.kube.evict(key[0], key[1], grace, drain=drain_id)
                    accepted[key] = replace(outcome, grace_s=grace, cut=True, at=self.clock())

    def _reserve(self, later: list[_Pod], final: float, instance_end: float | None) -> float:
        """Seconds kept for the later waves: their longest grace plus :data:`WAVE_PAD_S`, at most half the time left."""
        now = self.clock()
        until_end = None if instance_end is None else instance_end - now
        longest = max(granted_grace(e.grace_s, until_end, self.timing.grace_margin_s)[0] for e in later)
        return min(longest + WAVE_PAD_S, max(0.0, final - now) / 2)

    async def _launch(
        self,
        entries: list[_Pod],
        start: Callable[[_Pod, Slot | None], Coroutine[Any, Any, _Eviction]],
        running: _Running,
        guard: Callable[[], Awaitable[None]] | None = None,
        before: asyncio.Task[None] | None = None,
    ) -> None:
        """Start ``entries``' evictions into ``running``: surges at once, the others as :attr:`slots` free up, after
        ``before`` (the previous wave's launcher) and ``guard`` each turn, until one fails. Raises what ``guard``
        raises."""
        if before is not None:
            await before
        rest = [entry for entry in entries if entry.surge is None]
        for entry in entries:
            if entry.surge is not None:
                running.add(asyncio.create_task(start(entry, None)))
        while rest:
            if guard is not None:
                await guard()
            count = await self.slots.take(len(rest))
            if any(_failed(task) for task in running):  # the drain ends (a guard raised): no more start
                self.slots.give(count)
                return
            for entry in rest[:count]:
                slot = Slot(self.slots)
                task = asyncio.create_task(start(entry, slot))
                task.add_done_callback(slot.ended)  # also when it is cancelled before it ever ran
                running.add(task)
            del rest[:count]

    async def _evict(
        self,
        entry: _Pod,
        slot: Slot | None,
        *,
        bounds: DrainBounds,
        guard: Callable[[], Awaitable[None]] | None,
        evicted: Callable[[str, str], Awaitable[None]] | None,
        accepted: dict[tuple[str, str], _Eviction],
        drain_id: str,
        held: list[Surge],
        wave_by: Callable[[], float] | None = None,
    ) -> _Eviction:
        """Evict one pod (:meth:`_evict_until`), after its replacement when it asks for a surge (:meth:`_surge`);
        ``wave_by``: when its wave must be gone (``None``: the last wave)."""
        surge = (
            None
            if entry.surge is None
            else await self._surge(entry, entry.surge, bounds, guard, held, wave_by)
        )
        outcome = await self._evict_until(
            entry, bounds, guard, evicted, accepted, drain_id, slot, past_gate=surge is not None
        )
        if surge is not None and outcome.result in (EvictionOutcome.EVICTED, EvictionOutcome.GONE):
            await self.surges.end(surge)  # at once: a ReplicaSet that sees the pod go adds a pod of its own
        return outcome

    async def _evict_until(
        self,
        entry: _Pod,
        bounds: DrainBounds,
        guard: Callable[[], Awaitable[None]] | None,
        evicted: Callable[[str, str], Awaitable[None]] | None,
        accepted: dict[tuple[str, str], _Eviction],
        drain_id: str,
        slot: Slot | None = None,
        *,
        past_gate: bool = False,
    ) -> _Eviction:
        """Evict one pod, retrying with backoff until :meth:`DrainBounds.final`: how it ended. While its workload's
        budget is closed (:attr:`gates`) it waits without its slot, with jitter, counted as refused (``past_gate``:
        not the first time); the grace asked is :func:`~queue_processor.drain.order.granted_grace`'s."""
        namespace, name = entry.key
        delay = EVICTION_RETRY_S[0]
        blocking: str | None = None  # the PodDisruptionBudget whose refusal this pod counts in, if any

        def open_now() -> bool:
            return self.gates.closed(entry.owner, self.clock()) is None

        first = past_gate
        try:
            while True:
                if guard is not None:
                    await guard()
                closed = None if first else self.gates.closed(entry.owner, self.clock())
                if closed is not None:
                    if slot is not None:
                        slot.release()
                    if closed.budget != blocking:
                        self._blocking(blocking, -1)
                        blocking = closed.budget
                        self._blocking(blocking, +1)
                    if closed.until >= bounds.final(self.timing)[0]:
                        return self._evicted(entry, EvictionOutcome.PDB_BLOCKED, closed.message, blocking)
                    spread = random.uniform(0.0, 0.2) * closed.length_s
                    await bounds.sleep(
                        min(closed.until + spread, bounds.final(self.timing)[0]) - self.clock()
                    )
                    continue
                instance_end = bounds.instance_end
                until_end = None if instance_end is None else instance_end - self.clock()
                grace, cut = granted_grace(entry.grace_s, until_end, self.timing.grace_margin_s)
                try:
                    granted = grace if cut or self.grace_s >= 0 else None
                    try:
                        sending = None if first else open_now
                        first = False
                        await self.kube.evict(namespace, name, granted, drain=drain_id, sending=sending)
                    finally:
                        if slot is not None:
                            slot.release()
                except NotSentError:  # its budget refused another pod of the workload while it waited for QPS
                    continue
                except KubeError as exc:
                    if exc.status == 404:
                        return self._evicted(entry, EvictionOutcome.GONE, "gone")
                    if exc.status == 500 and "more than one PodDisruptionBudget" in exc.message:
                        detail = f"several PodDisruptionBudgets match it: {exc.message}"
                        return self._evicted(entry, EvictionOutcome.ERROR, detail)
                    if exc.status == 429:
                        budget = budget_of(exc, namespace)
                        if budget != blocking:
                            self._blocking(blocking, -1)
                            blocking = budget
                            self._blocking(blocking, +1)
                        if budget is not None and entry.owner is not None:
                            self.gates.refused(entry.owner, budget, exc.message, self.clock())
                            continue  # the gate says when to try again
                    if self.clock() + delay >= bounds.final(self.timing)[0]:
                        if exc.status == 429:
                            return self._evicted(entry, EvictionOutcome.PDB_BLOCKED, exc.message, blocking)
                        detail = f"{exc.status} {exc.reason}: {exc.message}"
                        return self._evicted(entry, EvictionOutcome.ERROR, detail)
                    if await bounds.sleep(delay * random.uniform(0.8, 1.2)):
                        delay = EVICTION_RETRY_S[0]  # a new end: try again now, with the new grace
                    else:
                        delay = min(delay * 2, EVICTION_RETRY_S[1])
                    continue
                self.gates.accepted(entry.owner)
                if evicted is not None:
                    await evicted(namespace, name)
                outcome = self._evicted(entry, EvictionOutcome.EVICTED, "evicted", grace_s=grace, cut=cut)
                accepted[entry.key] = outcome
                return outcome
        finally:
            self._blocking(blocking, -1)

    async def _surge(
        self,
        entry: _Pod,
        deployment: str,
        bounds: DrainBounds,
        guard: Callable[[], Awaitable[None]] | None,
        held: list[Surge],
        wave_by: Callable[[], float] | None = None,
    ) -> Surge | None:
        """Scale the pod's Deployment up (:mod:`queue_processor.drain.surge`) and wait for the replica, until the
        eviction must start for the pod's grace plus :data:`WAVE_PAD_S` to end before the drain's last moment and
        ``wave_by``. The surge to take back (in ``held`` from before its write) or ``None``. Raises what ``guard``
        raises."""
        namespace, name = entry.key
        graces: dict[int, int] = {}  # bounds version → the grace the pod is kept for

        def evict_by() -> float:
            # Fixed per bounds version: re-read every poll it would shrink and let the wait eat the pod's grace.
            if bounds.version not in graces:
                end = bounds.instance_end
                until_end = None if end is None else end - self.clock()
                graces.clear()
                graces[bounds.version] = granted_grace(entry.grace_s, until_end, self.timing.grace_margin_s)[
                    0
                ]
            by = (
                bounds.final(self.timing)[0]
                if wave_by is None
                else min(bounds.final(self.timing)[0], wave_by())
            )
            return by - graces[bounds.version] - WAVE_PAD_S

        def fallback(result: SurgeResult, why: str) -> None:
            self.observer.surge(result)
            log.warning(f"surge: {why}: evicted without a replacement first", pod=f"{namespace}/{name}")

        if evict_by() - self.clock() < SURGE_LEAST_S:
            fallback(SurgeResult.NO_TIME, "too little time before the eviction must start")
            return None
        if guard is not None:
            await guard()
        provisional = Surge(namespace, deployment, str(entry.uid), name)
        held.append(provisional)
        started = await self.surges.start(
            namespace, deployment, name, str(entry.uid), entry.labels or {}, room_s=evict_by() - self.clock()
        )
        held.remove(provisional)
        if isinstance(started, SurgeResult):
            fallback(
                started,
                {
                    SurgeResult.AUTOSCALED: "a HorizontalPodAutoscaler owns the replica count",
                    SurgeResult.NO_TIME: "too little time for the Deployment's minReadySeconds",
                }.get(started, "the Deployment cannot be scaled"),
            )
            return None
        held.append(started)
        if evict_by() - self.clock() < started.min_ready_s + SURGE_LEAST_S:
            fallback(SurgeResult.NO_TIME, "too little time for the Deployment's minReadySeconds")
            return started
        poll = 0.25
        while self.clock() < evict_by():
            if guard is not None:
                await guard()
            ready = await self.surges.ready(started)
            if ready is None:
                held.remove(started)
                fallback(SurgeResult.UNAVAILABLE, "the Deployment is gone or no longer records the surge")
                return None
            if ready:
                self.observer.surge(SurgeResult.SURGED)
                log.info("surge: the replacement is available: evicting", pod=f"{namespace}/{name}")
                return started
            await bounds.sleep(min(poll, max(0.0, evict_by() - self.clock())))
            poll = min(poll * 1.5, 2.0)
        if self.surges.undone(started):
            fallback(SurgeResult.UNDONE, "the owner set the Deployment's replica count back")
        else:
            fallback(SurgeResult.NOT_READY, "the replacement was not available in time")
        return started

    async def evict_last(self, namespace: str, name: str, deadline: float) -> bool:
        """Evict one pod (the controller's own) with its own grace, retrying 429s until ``deadline`` (a ``clock``
        reading): ``True`` once accepted or gone, ``False`` if refused to the end; raises :class:`KubeError` else."""
        delay = EVICTION_RETRY_S[0]
        while True:
            try:
                await self.kube.evict(namespace, name)
            except KubeError as exc:
                if exc.status == 404:
                    return True
                if exc.status != 429:
                    raise
                if self.clock() + delay >= deadline:
                    return False
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, EVICTION_RETRY_S[1])
                continue
            self.observer.eviction(EvictionOutcome.EVICTED)
            return True

    def _blocking(self, budget: str | None, change: int) -> None:
        """Count one pod more (+1) or fewer (-1) that ``budget`` refuses now, across drains; tell the observer."""
        if budget is None:
            return
        self.blocked[budget] += change
        self.observer.drain_blocked(budget, self.blocked[budget])
        if self.blocked[budget] <= 0:
            del self.blocked[budget]

    def _evicted(
        self,
        entry: _Pod,
        outcome: EvictionOutcome,
        detail: str,
        budget: str | None = None,
        *,
        grace_s: int | None = None,
        cut: bool = False,
    ) -> _Eviction:
        self.observer.eviction(outcome)
        return _Eviction(entry.key, outcome, detail, budget, grace_s, cut, self.clock())

    async def _wait_gone(
        self,
        node: str,
        waiting: set[tuple[tuple[str, str], Any]],
        deadline: Callable[[], float],
        bounds: DrainBounds,
        evictions: Iterable[asyncio.Task[Any]] = (),
        following: Waiting | None = None,
    ) -> set[tuple[tuple[str, str], Any]]:
        """Wait until none of ``waiting`` is left, ``deadline()`` passes or an eviction failed; those left. Covered by
        the watch it wakes as pods go, else re-lists with backoff; a covered wait ending with pods left lists once
        more."""
        departures = self.departures
        poll = 0.05
        while waiting:
            covered = following is not None and departures is not None and departures.covers(following)
            if following is not None:
                following.changed.clear()
            if covered and following is not None:
                waiting &= following.pending
            else:
                waiting &= await self._present(node, following)
            ended = not waiting or self.clock() >= deadline()
            if not ended and any(_failed(task) for task in evictions):
                ended = True
            if ended:
                if waiting and covered:
                    waiting &= await self._present(node, following)  # the last word is a list
                break
            remaining = max(0.0, deadline() - self.clock())
            if following is None:
                if not await bounds.sleep(min(poll, remaining)):
                    poll = min(poll * 1.5, 2.0)
            elif covered:  # until a pod goes, the watch stops, or the bounds tighten
                await bounds.sleep(remaining, wake=following.changed)
            elif not await bounds.sleep(min(poll, remaining), wake=following.changed):
                poll = min(poll * 1.5, 2.0)
        return waiting

    async def _present(self, node: str, following: Waiting | None) -> set[tuple[tuple[str, str], Any]]:
        """The (key, uid) of every pod on ``node`` now (a quorum list), told to the watch of deletions."""
        departures = self.departures
        ticket = departures.ticket() if departures is not None else None
        pods = await self.kube.pods_on_node(node)  # a quorum read: the cache may still show them
        present = {(pod_key(pod), pod["metadata"].get("uid")) for pod in pods}
        if following is not None and departures is not None:
            departures.listed(following, ticket, present)
        return present

    async def _delete_at_deadline(
        self, left: dict[tuple[str, str], Any], deleted: Callable[[str, str], Awaitable[None]] | None
    ) -> tuple[dict[tuple[str, str], Any], int, list[str]]:
        """DELETE_AT_DEADLINE: delete every pod left with grace 0 and its uid as precondition. Returns those not
        deleted, how many were, and a cause line per refusal (e.g. a 403 without the ``deleteAtDeadline`` rule)."""
        refused: list[str] = []

        async def delete(key: tuple[str, str], uid: Any) -> bool | None:
            namespace, name = key
            try:
                await self.kube.delete_pod(namespace, name, 0, uid=uid)
            except KubeError as exc:
                if exc.status in (404, 409):  # gone, or another pod of that name now
                    return None
                refused.append(f"deletion of {namespace}/{name} at the deadline failed: {exc}")
                return False
            self.observer.deleted_at_deadline()
            if deleted is not None:
                await deleted(namespace, name)
            return True

        done = await asyncio.gather(*(delete(key, uid) for key, uid in left.items()))
        kept = {key: uid for (key, uid), ok in zip(left.items(), done, strict=True) if ok is False}
        return kept, sum(1 for ok in done if ok), refused

    async def _causes(
        self, blocked: list[_Eviction], outcomes: list[_Eviction], left: list[_Pod]
    ) -> list[str]:
        """Why a drain did not finish, one line each: every budget that refused to the end (with its arithmetic
        read now), every failed eviction, and the pods evicted or being deleted that did not terminate."""
        causes: list[str] = []
        by_budget: dict[str | None, list[_Eviction]] = {}
        for outcome in blocked:
            by_budget.setdefault(outcome.budget, []).append(outcome)
        for budget, refused in by_budget.items():
            names = _names(f"{o.key[0]}/{o.key[1]}" for o in refused)
            if budget is None:
                causes.append(f"a PodDisruptionBudget refuses the eviction of {names}: {refused[0].detail}")
                continue
            causes.append(
                f"PodDisruptionBudget {budget} refuses the eviction of {names}: "
                + (await self._budget_status(budget) or refused[0].detail)
            )
        causes += [
            f"eviction of {o.key[0]}/{o.key[1]} failed: {o.detail}"
            for o in outcomes
            if o.result is EvictionOutcome.ERROR
        ]
        evicted = {o.key: o for o in outcomes if o.result in (EvictionOutcome.EVICTED, EvictionOutcome.GONE)}
        stuck = sorted((e for e in left if e.key in evicted or not e.evict), key=lambda e: e.key)
        if stuck:
            names = _names(
                f"{e.key[0]}/{e.key[1]} (grace {e.granted_s if e.granted_s is not None else e.grace_s} s)"
                if e.evict
                else f"{e.key[0]}/{e.key[1]} (being deleted before the drain)"
                for e in stuck
            )
            causes.append(f"evicted pods did not terminate: {names}")
        return causes

    async def _budget_status(self, budget: str) -> str | None:
        """The arithmetic of ``budget`` (``namespace/name``) now, or ``None`` when it cannot be read."""
        namespace, _, name = budget.partition("/")
        try:
            pdb = await self.kube.get_pdb(namespace, name)
        except KubeError:
            return None
        return None if pdb is None else budget_arithmetic(pdb)


class _Running:
    """A drain's launchers and evictions; an ended eviction is kept as its outcome alone, its task let go."""

    def __init__(self, launchers: list[asyncio.Task[None]]) -> None:
        self.launchers = launchers
        self._evictions: list[asyncio.Task[_Eviction] | _Eviction] = []  # in the order they started

    def add(self, task: asyncio.Task[_Eviction]) -> None:
        """Follow the eviction ``task``."""
        task.add_done_callback(functools.partial(self._ended, len(self._evictions)))
        self._evictions.append(task)

    def _ended(self, index: int, task: asyncio.Task[_Eviction]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._evictions[index] = task.result()

    def outcomes(self) -> list[_Eviction]:
        """Every eviction's outcome, in start order. Raises what an eviction raised, as ``task.result()``."""
        return [item if isinstance(item, _Eviction) else item.result() for item in self._evictions]

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        held = (item for item in self._evictions if isinstance(item, asyncio.Task))
        return itertools.chain(self.launchers, held)


def _failed(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` ended with an exception (not a cancellation)."""
    return task.done() and not task.cancelled() and task.exception() is not None


def _raise_failed(running: Iterable[asyncio.Task[Any]]) -> None:
    """Raise the exception of the first of ``running`` that failed, if one did."""
    for task in running:
        if _failed(task):
            raise task.exception()  # type: ignore[misc]  # not None: _failed


async def _settled(running: _Running) -> None:
    """Wait until every launcher and eviction of ``running`` has ended; raise the first failure at once."""
    _raise_failed(running)  # one may have failed already
    while pending := [task for task in running if not task.done()]:
        # Re-read after each end: a launcher adds evictions the wait did not cover.
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        _raise_failed(running)
    for task in running:
        task.result()  # a cancellation raises here, as gather would


def _names(names: Iterable[str], most: int = 5) -> str:
    """``a, b, c`` (at most ``most`` names, then ``and N more``)."""
    listed = list(names)
    shown = ", ".join(listed[:most])
    return shown + (f" and {len(listed) - most} more" if len(listed) > most else "")
