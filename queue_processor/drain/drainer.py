"""Drain one node with kubectl-drain semantics ("Safely Drain a Node"), as kubectl's ``RunNodeDrain``: list its
pods, plan (:mod:`~queue_processor.drain.plan`), evict wave by wave (:mod:`~queue_processor.drain.evictions`), wait
until they are gone or the deadline, delete what is left then when asked, summarise (:mod:`~.drain.summary`).
One code path whatever USE_APISERVER_CACHE says (DESIGN.md rule 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import structlog

from queue_processor import tasks
from queue_processor.config import default
from queue_processor.drain.budgets import budget_arithmetic
from queue_processor.drain.evictions import LEAST_SLOTS, Evictions, Running, failed, raise_failed, settled
from queue_processor.drain.filters import DrainOptions, pod_key
from queue_processor.drain.node_writes import NodeWrites
from queue_processor.drain.plan import (
    DRAIN_POLICY_ANNOTATION,
    WAVE_PAD_S,
    DrainBounds,
    DrainPod,
    DrainPolicy,
    DrainTiming,
    PolicyNotice,
    WavePlan,
    granted_grace,
    join_plans,
    plan_waves,
)
from queue_processor.drain.summary import (
    DrainResult,
    Eviction,
    Tally,
    causes,
    finished,
    grace_verdicts,
    summarise,
)
from queue_processor.drain.surge import Surge
from queue_processor.kube import KubeClient
from queue_processor.observe.events import SURGE_NOT_POSSIBLE, UNKNOWN_DRAIN_POLICY
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import ClaimLost, EvictionOutcome, KubeError
from queue_processor.watch.departures import Departures, Ticket, Waiting
from queue_processor.watch.node_cache import NodeCache

__all__ = ["LOOKED_AGAIN", "WAVE_TIME_UP", "DrainBounds", "DrainResult", "DrainTiming", "Drainer"]

#: Logged for the pods a drain's second list found (``pods``); they go after every pod of the first list.
LOOKED_AGAIN = "looked again: pods bound to the node after its first list"

#: Logged when a wave's time is up with its ``pods`` still on the node (``wave`` from 1): the next one starts.
WAVE_TIME_UP = "a wave's time is up: the next wave starts with pods of it still on the node"

log = structlog.get_logger("queue_processor.drain")


class Drainer:
    """Node drains through a :class:`KubeClient`: ``budget`` is DRAIN_BUDGET, ``grace_s``
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
        self.writes = NodeWrites(kube, nodes)
        """Cordons, taints and their undo."""
        self.evictions = Evictions(
            kube,
            timing=timing,
            grace_s=grace_s,
            observer=observer,
            clock=clock,
            in_flight=evictions_in_flight,
        )
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
        self._reported: set[tuple[str, str]] = set()  # (workload, annotation value) reported already

    @property
    def nodes(self) -> NodeCache | None:
        """The watched nodes a cordon writes on without reading the node first (``None``: a GET per cordon)."""
        return self.writes.nodes

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
        :class:`DrainBounds` that may tighten), in a drain-budget slot. ``guard`` runs before each eviction and raises
        to stop the drain (:meth:`queue_processor.leases.Claim.confirm`); with ``lost()`` true surges are left to the
        node's new owner. Callbacks must not raise: ``evicted``/``deleted(namespace, name)``, ``noticed(namespace,
        name, reason, message)`` once per workload and value whose drain annotation cannot be followed. Raises
        :class:`KubeError` when the pods cannot be listed, and what ``guard`` raises."""
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
        if relist_s > 0 and not planned.refused and finished(done):
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
            planned, done = join_plans(planned, later), Tally.joined(done, more)
        return summarise(planned, done, drain_id)

    async def _pass(
        self,
        node: str,
        execute: Callable[..., Awaitable[Tally]],
        noticed: Callable[[str, str, str, str], Awaitable[None]] | None,
        seen: set[tuple[tuple[str, str], Any]],
        cached: bool,
    ) -> tuple[WavePlan, Tally]:
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
            return planned, Tally()
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
    ) -> Tally:
        """Evict wave by wave, wait, take the deadline step if due; stopped, take surges back unless ``lost()``."""
        running = Running([])  # its evictions grow as each wave's launcher starts them
        accepted: dict[tuple[str, str], Eviction] = {}  # evictions the API server took, as last given
        by_key = {entry.key: entry for wave in planned.waves for entry in wave}
        held: list[Surge] = []  # surges of this drain: taken back when it ends, if not before
        recut = tasks.spawn(self._recut(bounds, by_key, accepted, drain_id), name=f"recut-{node}")
        start = functools.partial(
            self.evictions.evict,
            bounds=bounds,
            guard=guard,
            evicted=evicted,
            accepted=accepted,
            drain_id=drain_id,
            held=held,
        )
        try:
            await self._run_waves(node, planned, bounds, running, start, guard, following)
            waiting = {(entry.key, entry.uid) for entry in by_key.values()}
            final = lambda: bounds.final(self.timing)[0]  # noqa: E731
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
        return await self._conclude(outcomes, by_key, left, bounds, held, deleted)

    async def _run_waves(
        self,
        node: str,
        planned: WavePlan,
        bounds: DrainBounds,
        running: Running,
        start: Callable[..., Coroutine[Any, Any, Eviction]],
        guard: Callable[[], Awaitable[None]] | None,
        following: Waiting | None,
    ) -> None:
        """Start each wave's evictions after the previous wave's (``start(entry, slot, wave_by=...)``) and wait for
        its pods to go until its bound, when a later wave keeps time for itself; then wait for every eviction."""
        launchers = running.launchers
        for index, wave in enumerate(planned.waves):
            raise_failed(running)  # a wave's wait ended on a failure: no later wave starts
            before = launchers[-1] if launchers else None
            later = [entry for later_wave in planned.waves[index + 1 :] for entry in later_wave]
            wave_by = self._wave_bound(bounds, later) if later else None
            evicting = [entry for entry in wave if entry.evict]
            launch = self.evictions.launch(
                evicting, functools.partial(start, wave_by=wave_by), running, guard, before
            )
            launchers.append(tasks.spawn(launch, name=f"evictions-{node}", awaited=True))
            if wave_by is not None:
                pods = {(e.key, e.uid) for e in wave}
                behind = await self._wait_gone(node, pods, wave_by, bounds, running, following)
                if behind and not any(failed(task) for task in running):
                    names = sorted(f"{key[0]}/{key[1]}" for key, _ in behind)
                    log.info(WAVE_TIME_UP, node=node, wave=index + 1, pods=names)
        await settled(running)

    def _wave_bound(self, bounds: DrainBounds, later: list[DrainPod]) -> Callable[[], float]:
        """When a wave's wait ends: the drain's last moment less the time kept for the ``later`` waves."""
        # Planned once per bounds version: re-planned every poll it would keep pushing the next wave later.
        kept: dict[int, float] = {}

        def wave_bound() -> float:
            if bounds.version not in kept:
                final = bounds.final(self.timing)[0]
                kept.clear()
                kept[bounds.version] = final - self._reserve(later, final, bounds.instance_end)
            return kept[bounds.version]

        return wave_bound

    async def _conclude(
        self,
        outcomes: list[Eviction],
        by_key: dict[tuple[str, str], DrainPod],
        left: dict[tuple[str, str], Any],
        bounds: DrainBounds,
        held: list[Surge],
        deleted: Callable[[str, str], Awaitable[None]] | None,
    ) -> Tally:
        """After the waits: grace verdicts, the deadline step if due, surges taken back, and the causes."""
        for outcome in outcomes:
            by_key[outcome.key].granted_s, by_key[outcome.key].cut = outcome.grace_s, outcome.cut
        graces = grace_verdicts(outcomes, left, bounds.instance_end)
        for grace in graces.values():
            self.observer.pod_drained(grace)
        removed = 0
        refused: list[str] = []  # deletions at the deadline the API server refused
        if left and bounds.final(self.timing)[1]:
            left, removed, refused = await self._delete_at_deadline(left, deleted)
        await self._take_back(held)  # those whose pod was not evicted: kept until the deadline step
        blocked = [o for o in outcomes if o.result is EvictionOutcome.PDB_BLOCKED]
        erred = any(o.result is EvictionOutcome.ERROR for o in outcomes)
        stuck = [by_key[key] for key in left]
        why = (
            await causes(blocked, outcomes, stuck, self._budget_status) + refused
            if blocked or erred or left
            else []
        )
        return Tally(outcomes, graces, len(left), removed, why)

    async def _take_back(self, held: list[Surge]) -> None:
        """End every surge of ``held`` not ended yet (one read each for those that were)."""
        for surge in held:
            await self.evictions.surges.end(surge)

    async def _recut(
        self,
        bounds: DrainBounds,
        pods: Mapping[tuple[str, str], DrainPod],
        accepted: dict[tuple[str, str], Eviction],
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

    def _reserve(self, later: list[DrainPod], final: float, instance_end: float | None) -> float:
        """Seconds kept for the later waves: their longest grace plus :data:`WAVE_PAD_S`, at most half the time left."""
        now = self.clock()
        until_end = None if instance_end is None else instance_end - now
        longest = max(granted_grace(e.grace_s, until_end, self.timing.grace_margin_s)[0] for e in later)
        return min(longest + WAVE_PAD_S, max(0.0, final - now) / 2)

    async def _wait_gone(
        self,
        node: str,
        waiting: set[tuple[tuple[str, str], Any]],
        deadline: Callable[[], float],
        bounds: DrainBounds,
        evictions: Iterable[asyncio.Task[Any]] = (),
        following: Waiting | None = None,
    ) -> set[tuple[tuple[str, str], Any]]:
        """Wait until none of ``waiting`` is left, ``deadline()`` passes or an eviction failed; those left. Woken by the
        watch when covered (then one last list if pods are left), else re-listing with backoff."""
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
            if not ended and any(failed(task) for task in evictions):
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

    async def _budget_status(self, budget: str) -> str | None:
        """The arithmetic of ``budget`` (``namespace/name``) now, or ``None`` when it cannot be read."""
        namespace, _, name = budget.partition("/")
        try:
            pdb = await self.kube.get_pdb(namespace, name)
        except KubeError:
            return None
        return None if pdb is None else budget_arithmetic(pdb)
