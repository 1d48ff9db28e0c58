"""Drain one node as kubectl's ``RunNodeDrain`` ("Safely Drain a Node"): list its pods, plan
(:mod:`~queue_processor.drain.plan`), evict wave by wave (:mod:`~queue_processor.drain.evictions`), wait until they
are gone or the deadline, delete what is left when asked, summarise; one path whatever USE_APISERVER_CACHE says."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import structlog

from queue_processor import rest
from queue_processor.config import default
from queue_processor.drain.evictions import (
    LEAST_SLOTS,
    DrainRun,
    Evictions,
    Running,
    Tell,
    budget_arithmetic,
)
from queue_processor.drain.node_writes import NodeWrites
from queue_processor.drain.plan import (
    DRAIN_POLICY_ANNOTATION,
    WAVE_PAD_S,
    DrainBounds,
    DrainOptions,
    DrainPod,
    DrainPolicy,
    DrainTiming,
    Eviction,
    PodDecision,
    PolicyNotice,
    WavePlan,
    join_plans,
    plan_waves,
    pod_key,
)
from queue_processor.kube import KubeClient
from queue_processor.observe.events import POD_DELETED_AT_DEADLINE, SURGE_NOT_POSSIBLE, UNKNOWN_DRAIN_POLICY
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import ClaimLost, DrainOutcome, EvictionOutcome, KubeError
from queue_processor.watch import Departures, NodeCache, Waiting

#: Logged for the pods a drain's second list found (``pods``); they go after every pod of the first list.
LOOKED_AGAIN = "looked again: pods bound to the node after its first list"

#: Logged when a wave's time is up with its ``pods`` still on the node (``wave`` from 1): the next one starts.
WAVE_TIME_UP = "a wave's time is up: the next wave starts with pods of it still on the node"

log = structlog.get_logger("queue_processor.drain")

PodRefs = set[tuple[tuple[str, str], Any]]  # ((namespace, name), uid) of pods on a node


@dataclass
class DrainResult:
    """How a drain ended: ``completed`` when every pod to evict is gone, else ``reason``; ``outcome`` says which. Pods:
    ``evicted`` (``cut_short``: with a cut grace), ``blocked`` (by a budget to the end), ``failed``, ``skipped``,
    ``deleted_at_deadline``, ``remaining``, per wave: ``waves``; ``causes``; ``drain_id``: ``drain/<id>`` User-Agent."""

    completed: bool
    outcome: DrainOutcome = DrainOutcome.TIMEOUT
    reason: str | None = None
    evicted: int = 0
    blocked: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[PodDecision] = field(default_factory=list)
    remaining: int = 0
    cut_short: int = 0
    deleted_at_deadline: int = 0
    waves: list[int] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    drain_id: str = ""


def grace_verdicts(
    outcomes: list[Eviction], left: Mapping[tuple[str, str], Any], instance_end: float | None
) -> Iterator[Literal["own", "cut", "outlasted"]]:
    """How each evicted pod's grace went (pure): ``cut``, ``own`` (all of it before the instance's end, or, that
    unknown, gone by the drain's end) or ``outlasted`` (killed mid-grace when the instance goes)."""
    for outcome in outcomes:
        if outcome.result is not EvictionOutcome.EVICTED or outcome.grace_s is None:
            continue
        if outcome.cut:
            yield "cut"
        elif instance_end is not None:
            yield "own" if outcome.at + outcome.grace_s <= instance_end else "outlasted"
        elif outcome.key not in left:
            yield "own"


@dataclass
class Tally:
    """What a drain's execution saw (evictions with re-cuts, counts, causes)."""

    outcomes: list[Eviction] = field(default_factory=list)
    remaining: int = 0
    deleted: int = 0
    causes: list[str] = field(default_factory=list)

    def joined(self, later: Tally) -> Tally:
        """What two passes of one drain saw, together, field by field."""
        return Tally(*(getattr(self, part.name) + getattr(later, part.name) for part in fields(Tally)))

    def finished(self) -> bool:
        return not self.remaining and not any(o.result is EvictionOutcome.ERROR for o in self.outcomes)


def summarise(planned: WavePlan, done: Tally, drain_id: str) -> DrainResult:
    """The :class:`DrainResult` of a drain (pure): built once, from its plan and what its execution saw."""
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
    if failed or done.remaining:
        outcome = DrainOutcome.ERROR if failed else DrainOutcome.TIMEOUT
    else:
        outcome = DrainOutcome.DELETED if done.deleted else DrainOutcome.DRAINED
    return DrainResult(
        completed=done.finished(),
        outcome=outcome,
        reason=None if done.finished() else "; ".join(done.causes),
        evicted=len(evicted),
        blocked=sum(1 for o in done.outcomes if o.result is EvictionOutcome.PDB_BLOCKED),
        failed=failed,
        skipped=planned.skipped,
        remaining=done.remaining,
        cut_short=sum(1 for o in evicted if o.cut),
        deleted_at_deadline=done.deleted,
        waves=[len(wave) for wave in planned.waves],
        causes=done.causes,
        drain_id=drain_id,
    )


def names_of(names: Iterable[str], most: int = 5) -> str:
    """``a, b, c`` (at most ``most`` names, then ``and N more``)."""
    listed = list(names)
    shown = ", ".join(listed[:most])
    return shown + (f" and {len(listed) - most} more" if len(listed) > most else "")


class Drainer:
    """Node drains through a :class:`KubeClient`; ``clock``: monotonic seconds; ``budget``: DRAIN_BUDGET, ``grace_s``:
    POD_TERMINATION_GRACE_PERIOD, ``use_cache``: USE_APISERVER_CACHE."""

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
        self.evictions = Evictions(
            kube,
            timing=timing,
            grace_s=grace_s,
            observer=observer,
            clock=clock,
            in_flight=evictions_in_flight,
        )
        self.departures = departures  # the watch of pod deletions a drain waits on (None: it re-lists)
        self.options = options
        self.budget = asyncio.Semaphore(budget)
        self.grace_s = grace_s
        self.use_cache = use_cache
        self.timing = timing
        self.observer = observer
        self.clock = clock
        self.draining = 0
        self._reported: set[tuple[str, str]] = set()  # (workload, annotation value) reported already

    async def drain(
        self,
        node: str,
        deadline: float | DrainBounds,
        *,
        instance_end: float | None = None,
        guard: Callable[[], Awaitable[None]] | None = None,
        lost: Callable[[], bool] | None = None,
        tell: Tell | None = None,
    ) -> DrainResult:
        """Evict the node's pods and wait until gone or the deadline (a ``clock`` reading, or :class:`DrainBounds` that
        may tighten), in a drain-budget slot. ``guard`` runs before each eviction and raises to stop the drain; with
        ``lost()`` true surges are left to the node's new owner; ``tell`` (must not raise) records pod Events. Raises
        :class:`KubeError` when the pods cannot be listed, and what ``guard`` raises."""
        bounds = deadline if isinstance(deadline, DrainBounds) else DrainBounds(deadline, instance_end)
        run = DrainRun(bounds, uuid.uuid4().hex[:12], guard, lost, tell, node)
        async with self.budget:
            self.draining += 1
            self.observer.draining(self.draining)
            try:
                return await self._drain(node, run)
            finally:
                self.draining -= 1
                self.observer.draining(self.draining)

    async def _drain(self, node: str, run: DrainRun) -> DrainResult:
        """Plan (pure), execute, look again (DRAIN_RELIST_AFTER), summarise (pure)."""
        relist_at = self.clock() + self.timing.relist_s
        planned, done = await self._pass(node, run, set(), self.use_cache)
        if self.timing.relist_s > 0 and not planned.refused and done.finished():
            await run.bounds.sleep(min(relist_at, run.bounds.final(self.timing)[0]) - self.clock())
            seen = {(entry.key, entry.uid) for wave in planned.waves for entry in wave}
            seen |= {((d.namespace, d.name), None) for d in planned.skipped}
            later, more = await self._pass(node, run, seen, True)
            if late := sorted(f"{e.key[0]}/{e.key[1]}" for wave in later.waves for e in wave):
                log.info(LOOKED_AGAIN, node=node, pods=late)
            planned, done = join_plans(planned, later), Tally.joined(done, more)
        return summarise(planned, done, run.drain_id)

    async def _pass(self, node: str, run: DrainRun, seen: PodRefs, cached: bool) -> tuple[WavePlan, Tally]:
        """List the node's pods (``cached``: ``resourceVersion=0``), and plan and execute those not ``seen``."""
        # Taken before the list: the watch then reports every deletion of a listed pod the list did not see.
        ticket = self.departures.ticket() if self.departures is not None and not cached else None
        pods = [
            pod
            for pod in await self.kube.pods_on_node(node, cached=cached)
            if (pod_key(pod), pod["metadata"].get("uid")) not in seen and (pod_key(pod), None) not in seen
        ]
        planned = plan_waves(pods, self.options, self.timing, self.grace_s)
        del pods  # names, not pod objects, for the rest of the drain
        if planned.refused or not any(planned.waves):
            return planned, Tally()
        await self._report(planned.notices, run)
        entries = {(entry.key, entry.uid) for wave in planned.waves for entry in wave}
        departures = self.departures
        watching = contextlib.nullcontext() if departures is None else departures.waiting(entries, ticket)
        with watching as following:
            done = await self._execute(node, replace(run, accepted={}, held=[]), planned, following)
        return planned, done

    async def _report(self, notices: list[PolicyNotice], run: DrainRun) -> None:
        """Warn and tell an Event once per workload and value for a drain policy that cannot be followed."""
        for notice in notices:
            if (notice.workload, notice.value) in self._reported:
                continue
            self._reported.add((notice.workload, notice.value))
            problem, line = {
                "unknown": (
                    f"is not a drain policy ({', '.join(DrainPolicy)})",
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
            reason = UNKNOWN_DRAIN_POLICY if notice.why == "unknown" else SURGE_NOT_POSSIBLE
            await run.record((notice.namespace, notice.name), (reason, message), warning=True)

    async def _execute(self, node: str, run: DrainRun, planned: WavePlan, following: Waiting | None) -> Tally:
        """Evict wave by wave, wait, the deadline step, surges back, causes; stopped: surges back unless ``lost()``."""
        running = Running([])  # its evictions grow as each wave's launcher starts them
        by_key = {entry.key: entry for wave in planned.waves for entry in wave}
        recut = rest.spawn(self._recut_graces(run, by_key), name=f"recut-{node}")
        try:
            await self._run_waves(node, planned, run, running, following)
            waiting = {(entry.key, entry.uid) for entry in by_key.values()}
            final = lambda: run.bounds.final(self.timing)[0]  # noqa: E731
            left = dict(await self._wait_gone(node, waiting, final, run.bounds, running, following))
        except BaseException as exc:
            # One stop for all (a second cancellation leaves nothing running); a lost Lease's new owner takes surges.
            await rest.stop(*running)
            if not isinstance(exc, ClaimLost) and not (run.lost is not None and run.lost()):
                for surge in run.held:
                    await self.evictions.surges.end(surge)
            raise
        finally:
            await rest.stop(recut)
        outcomes = [run.accepted.get(ended.key, ended) for ended in running.outcomes()]  # re-cuts included
        for grace in grace_verdicts(outcomes, left, run.bounds.instance_end):
            self.observer.pod_drained(grace)
        left, removed, refused = await self._delete_at_deadline(left, run)
        for surge in run.held:  # those whose pod was not evicted: kept until the deadline step
            await self.evictions.surges.end(surge)
        why = await self._causes(outcomes, [by_key[key] for key in left]) + refused
        return Tally(outcomes, len(left), removed, why)

    async def _run_waves(
        self, node: str, planned: WavePlan, run: DrainRun, running: Running, following: Waiting | None
    ) -> None:
        """Evict wave after wave, each waited for until its bound (when a later wave keeps time); then await all."""
        launchers = running.launchers
        for index, wave in enumerate(planned.waves):
            if (failure := running.failure()) is not None:  # a wave's wait ended on it: no later wave starts
                raise failure
            before = launchers[-1] if launchers else None
            later = [entry for later_wave in planned.waves[index + 1 :] for entry in later_wave]
            wave_by = self._wave_bound(run.bounds, later) if later else None
            evicting = [entry for entry in wave if entry.evict]
            launch = self.evictions.launch(evicting, run, running, before, wave_by)
            launchers.append(rest.spawn(launch, name=f"evictions-{node}", awaited=True))
            if wave_by is not None:
                pods = {(e.key, e.uid) for e in wave}
                behind = await self._wait_gone(node, pods, wave_by, run.bounds, running, following)
                if behind and running.failure() is None:
                    names = sorted(f"{key[0]}/{key[1]}" for key, _ in behind)
                    log.info(WAVE_TIME_UP, node=node, wave=index + 1, pods=names)
        await running.settled()

    def _wave_bound(self, bounds: DrainBounds, later: list[DrainPod]) -> Callable[[], float]:
        """When a wave's wait ends: the drain's last moment less the time kept for the ``later`` waves, their longest
        grace plus :data:`WAVE_PAD_S`, at most half the time left."""

        def wave_bound() -> float:
            final, now = bounds.final(self.timing)[0], self.clock()
            longest = max(bounds.grace(e.grace_s, self.timing, now)[0] for e in later)
            return final - min(longest + WAVE_PAD_S, max(0.0, final - now) / 2)

        return bounds.fixed(wave_bound)  # re-planned every poll it would keep pushing the next wave later

    async def _recut_graces(self, run: DrainRun, pods: Mapping[tuple[str, str], DrainPod]) -> None:
        """On each tightening, evict again with a cut grace each evicted pod whose grace would outlast the new end."""
        while True:
            await run.bounds.tightening()  # no instance end: nothing is cut
            for key, outcome in list(run.accepted.items()):
                if outcome.result is not EvictionOutcome.EVICTED or outcome.grace_s is None:
                    continue
                grace, cut = run.bounds.grace(pods[key].grace_s, self.timing, self.clock())
                if not cut or self.clock() + grace >= outcome.at + outcome.grace_s:
                    continue
                with contextlib.suppress(KubeError):
                    await self.kube.evict(key[0], key[1], grace, drain=run.drain_id)
                    run.accepted[key] = replace(outcome, grace_s=grace, cut=True, at=self.clock())

    async def _wait_gone(
        self,
        node: str,
        waiting: PodRefs,
        deadline: Callable[[], float],
        bounds: DrainBounds,
        running: Running,
        following: Waiting | None,
    ) -> PodRefs:
        """Wait until none of ``waiting`` is left, ``deadline()`` passes or an eviction failed; those left. Woken by the
        watch when covered (then one last list if pods are left), else re-listing with backoff."""
        departures = self.departures
        poll = 0.05
        while waiting:
            watched = following is not None and departures is not None and departures.covers(following)
            covered = following if watched else None
            if following is not None:
                following.changed.clear()
            waiting &= covered.pending if covered else await self._present(node, following)
            if not waiting or self.clock() >= deadline() or running.failure() is not None:
                if waiting and covered:
                    waiting &= await self._present(node, following)  # the last word is a list
                break
            remaining = max(0.0, deadline() - self.clock())
            if covered:  # until a pod goes, the watch stops, or the bounds tighten
                await bounds.sleep(remaining, wake=covered.changed)
            elif not await bounds.sleep(min(poll, remaining), wake=following.changed if following else None):
                poll = min(poll * 1.5, 2.0)
        return waiting

    async def _present(self, node: str, following: Waiting | None) -> PodRefs:
        """The (key, uid) of every pod on ``node`` now (a quorum list), told to the watch of deletions."""
        departures = self.departures
        ticket = departures.ticket() if departures is not None else None
        pods = await self.kube.pods_on_node(node)  # a quorum read: the cache may still show them
        present = {(pod_key(pod), pod["metadata"].get("uid")) for pod in pods}
        if following is not None and departures is not None:
            departures.listed(following, ticket, present)
        return present

    async def _delete_at_deadline(
        self, left: dict[tuple[str, str], Any], run: DrainRun
    ) -> tuple[dict[tuple[str, str], Any], int, list[str]]:
        """DELETE_AT_DEADLINE, when due: delete the pods left (grace 0, uid precondition); those kept, count, causes."""
        refused: list[str] = []
        if not left or not run.bounds.final(self.timing)[1]:
            return left, 0, refused

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
            await run.record(key, POD_DELETED_AT_DEADLINE, warning=True)
            return True

        done = await asyncio.gather(*(delete(key, uid) for key, uid in left.items()))
        kept = {key: uid for (key, uid), ok in zip(left.items(), done, strict=True) if ok is False}
        return kept, sum(1 for ok in done if ok), refused

    async def _causes(self, outcomes: list[Eviction], left: list[DrainPod]) -> list[str]:
        """Why a drain did not finish, a line each: every budget that refused to the end (with its arithmetic now, when
        it can be read), every failed eviction, the pods evicted or being deleted still there."""
        lines: list[str] = []
        by_budget: dict[str | None, list[Eviction]] = {}
        for outcome in outcomes:
            if outcome.result is EvictionOutcome.PDB_BLOCKED:
                by_budget.setdefault(outcome.budget, []).append(outcome)
        for budget, refused in by_budget.items():
            names = names_of(f"{o.key[0]}/{o.key[1]}" for o in refused)
            if budget is None:
                lines.append(f"a PodDisruptionBudget refuses the eviction of {names}: {refused[0].detail}")
                continue
            status = refused[0].detail  # the 429's own words when the budget cannot be read
            with contextlib.suppress(KubeError):
                if (pdb := await self.kube.get_pdb(*budget.split("/", 1))) is not None:
                    status = budget_arithmetic(pdb)
            lines.append(f"PodDisruptionBudget {budget} refuses the eviction of {names}: {status}")
        lines += [
            f"eviction of {o.key[0]}/{o.key[1]} failed: {o.detail}"
            for o in outcomes
            if o.result is EvictionOutcome.ERROR
        ]
        evicted = {o.key for o in outcomes if o.result in (EvictionOutcome.EVICTED, EvictionOutcome.GONE)}
        granted = {o.key: o.grace_s for o in outcomes if o.grace_s is not None}
        stuck = sorted((e for e in left if e.key in evicted or not e.evict), key=lambda e: e.key)
        if stuck:
            names = names_of(
                f"{e.key[0]}/{e.key[1]} (grace {granted.get(e.key, e.grace_s)} s)"
                if e.evict
                else f"{e.key[0]}/{e.key[1]} (being deleted before the drain)"
                for e in stuck
            )
            lines.append(f"evicted pods did not terminate: {names}")
        return lines
