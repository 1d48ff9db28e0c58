"""One pod's eviction through the policy/v1 Eviction API ("API-initiated Eviction"), as Karpenter's eviction queue:
429s retried with backoff until the drain's last moment, 404 gone, 500 failed; a surge pod's replacement first.
Across drains, :class:`Slots` bound evictions awaiting their first request and :class:`BudgetGates` hold a workload's
pods while the budget a 429 names (``pkg/registry/core/pod/storage/eviction.go``) refuses."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import re
import sys
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from queue_processor.drain.plan import WAVE_PAD_S, DrainBounds, DrainPod, DrainTiming, Eviction
from queue_processor.drain.surge import SURGE_LEAST_S, Surge, Surges
from queue_processor.kube import KubeClient
from queue_processor.observe.events import POD_EVICTION
from queue_processor.observe.metrics import Observer
from queue_processor.outcomes import EvictionOutcome, KubeError, SurgeResult

#: The fewest slots, whatever the QPS.
LEAST_SLOTS = 64


def evictions_in_flight(qps: float, burst: int) -> int:
    """Slots for KUBE_API_QPS ``qps``, KUBE_API_BURST ``burst``: 2 s of tokens or the burst, ≥ :data:`LEAST_SLOTS`."""
    return max(LEAST_SLOTS, int(2 * qps), burst)


class Slots:
    """A first-come-first-served counting gate of ``size`` slots; ``ValueError`` when below 1. One event loop."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.free = size
        self._line: deque[tuple[int, asyncio.Future[int]]] = deque()

    async def take_slots(self, wanted: int) -> int:
        """Wait in line for a free slot, then take up to ``wanted`` (≥ 1): how many. Cancelled: takes none, raises."""
        wanted = max(1, wanted)
        if not self._line and self.free >= 1:
            count = min(wanted, self.free)
            self.free -= count
            return count
        turn: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (wanted, turn)
        self._line.append(entry)
        try:
            return await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give(turn.result())  # its turn came as it was cancelled: the slots go on
            else:
                with contextlib.suppress(ValueError):  # skipped already by give
                    self._line.remove(entry)
            raise

    def give(self, count: int = 1) -> None:
        """Return ``count`` slots taken with :meth:`take_slots`, serving the head of the line."""
        self.free += count
        while self._line and self.free >= 1:
            wanted, turn = self._line.popleft()
            if turn.done():  # cancelled, its caller not yet resumed to leave the line: skipped
                continue
            served = min(wanted, self.free)
            self.free -= served
            turn.set_result(served)


class Slot:
    """One slot of ``slots``, held by one eviction until its first request is answered (or it waits at a gate)."""

    __slots__ = ("_slots",)

    def __init__(self, slots: Slots) -> None:
        self._slots: Slots | None = slots

    def release(self, _task: object = None) -> None:
        """Give the slot back, the first time only (also the eviction task's done callback)."""
        if self._slots is not None:
            self._slots.give(1)
            self._slots = None


def budget_of(error: KubeError, namespace: str) -> str | None:
    """``namespace/name`` of the budget a 429's ``DisruptionBudget`` cause names ("The disruption budget NAME ..")."""
    for cause in error.causes:
        if cause.get("reason") == "DisruptionBudget":
            match = re.match(r"The disruption budget (\S+) ", str(cause.get("message") or ""))
            if match:
                return f"{namespace}/{match.group(1)}"
    return None


def budget_arithmetic(pdb: Mapping[str, Any]) -> str:
    """A PodDisruptionBudget's spec, status and unhealthyPodEvictionPolicy in one line: ``minAvailable 2, ...``."""
    spec = pdb.get("spec") or {}
    status = pdb.get("status") or {}
    parts = [
        f"{name} {spec[name]}" for name in ("minAvailable", "maxUnavailable") if spec.get(name) is not None
    ]
    parts += [
        f"{name} {status.get(name, 0)}"
        for name in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods")
    ]
    policy = spec.get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
    return ", ".join([*parts, f"unhealthyPodEvictionPolicy {policy}"])


#: How long a budget stays closed after its first refusal (seconds; kubectl retries after 5 s).
GATE_FIRST_S = 1.0

#: The longest closing (seconds), reached by doubling while the budget refuses the pods tried at each reopening.
GATE_MOST_S = 10.0

#: A budget that refused nothing for this long (seconds) is forgotten, with the owners learnt for it.
GATE_FORGET_S = 300.0


@dataclass
class Closed:
    """A budget that refused lately: reopening (clock), last closing (seconds), last 429's message, last refusal."""

    budget: str
    until: float
    length_s: float
    message: str
    last: float = 0.0


class BudgetGates:
    """Budgets that refused lately and the owners they cover; times: caller clock readings (seconds). One loop."""

    def __init__(self) -> None:
        self._budgets: dict[str, Closed] = {}
        self._owners: dict[str, str] = {}  # controller owner uid → the budget that refused one of its pods

    def closed(self, owner: str | None, now: float) -> Closed | None:
        """The budget closed on ``owner``'s pods, or ``None`` when they may be tried now (no ``owner``: always)."""
        name = None if owner is None else self._owners.get(owner)
        budget = None if name is None else self._budgets.get(name)
        return None if budget is None or budget.until <= now else budget

    def refused(self, owner: str | None, budget: str, message: str, now: float) -> None:
        """A 429 of ``budget`` for a pod of ``owner``: link them and close the budget unless closed, for
        :data:`GATE_FIRST_S`, or twice the last closing (up to :data:`GATE_MOST_S`) when it refuses again at once."""
        if owner is not None:
            self._owners[sys.intern(owner)] = budget
        state = self._budgets.get(budget)
        if state is None:
            self._forget(now)
            state = self._budgets[budget] = Closed(budget, now, 0.0, message)
        state.last = now
        if state.until <= now:
            again = state.length_s > 0 and now - state.until <= state.length_s
            state.length_s = min(state.length_s * 2, GATE_MOST_S) if again else GATE_FIRST_S
            state.until = now + state.length_s
            state.message = message

    def accepted(self, owner: str | None) -> None:
        """An eviction of ``owner``'s pod was accepted: reset its budget's backoff and unlink the owner."""
        name = None if owner is None else self._owners.pop(owner, None)
        state = None if name is None else self._budgets.get(name)
        if state is not None:
            state.length_s = 0.0

    def _forget(self, now: float) -> None:
        stale = {name for name, state in self._budgets.items() if now - state.last > GATE_FORGET_S}
        if stale:
            for name in stale:
                del self._budgets[name]
            self._owners = {owner: name for owner, name in self._owners.items() if name not in stale}


#: kubectl waits 5 s before retrying an eviction a PodDisruptionBudget refused; we start lower and back off.
EVICTION_RETRY_S = (1.0, 10.0)

log = structlog.get_logger("queue_processor.drain")


class Tell(Protocol):
    """Records an Event on a pod, as :meth:`~queue_processor.observe.events.NodeEventRecorder.record_pod`."""

    async def __call__(
        self, namespace: str, name: str, reason: str, message: str, *, warning: bool = False
    ) -> None: ...


@dataclass
class DrainRun:
    """One drain of ``node`` as its evictions see it: ``bounds``, ``drain_id``, ``guard``, ``lost``, ``tell`` as
    :meth:`Drainer.drain` has them; the evictions ``accepted`` (as last given), the surges ``held`` (to take back)."""

    bounds: DrainBounds
    drain_id: str = ""
    guard: Callable[[], Awaitable[None]] | None = None
    lost: Callable[[], bool] | None = None
    tell: Tell | None = None
    node: str = ""
    accepted: dict[tuple[str, str], Eviction] = field(default_factory=dict)
    held: list[Surge] = field(default_factory=list)

    async def confirm(self) -> None:
        if self.guard is not None:
            await self.guard()

    async def record(self, key: tuple[str, str], event: tuple[str, str], *, warning: bool = False) -> None:
        """Tell the pod ``key``'s Event ``(reason, message)``, ``{node}`` in the message filled in."""
        if self.tell is not None:
            await self.tell(*key, event[0], event[1].format(node=self.node), warning=warning)


class Evictions:
    """Evictions of every drain through ``kube``: ``grace_s`` POD_TERMINATION_GRACE_PERIOD, ``clock`` monotonic
    seconds, ``in_flight`` evictions awaiting their first answer at once (:func:`evictions_in_flight`)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        timing: DrainTiming,
        grace_s: int,
        observer: Observer,
        clock: Callable[[], float],
        in_flight: int,
    ) -> None:
        self.kube = kube
        self.timing = timing
        self.grace_s = grace_s
        self.observer = observer
        self.clock = clock
        self.slots = Slots(in_flight)
        self.blocked: Counter[str] = Counter()  # budget (namespace/name) → pods it refuses now, across drains
        self.gates = BudgetGates()
        self.surges = Surges(kube)

    async def launch(
        self,
        entries: list[DrainPod],
        run: DrainRun,
        running: Running,
        before: asyncio.Task[None] | None = None,
        wave_by: Callable[[], float] | None = None,
    ) -> None:
        """Start ``entries``' evictions (:meth:`evict`) into ``running``: surges at once, the others as :attr:`slots`
        free up, after ``before`` (the previous wave's launcher) and the guard each turn, until one fails (raised)."""
        if before is not None:
            await before
        rest = [entry for entry in entries if entry.surge is None]
        for entry in entries:
            if entry.surge is not None:
                running.add(asyncio.create_task(self.evict(entry, None, run, wave_by)))
        while rest:
            await run.confirm()
            count = await self.slots.take_slots(len(rest))
            if running.failure() is not None:  # the drain ends (a guard raised): no more start
                self.slots.give(count)
                return
            for entry in rest[:count]:
                slot = Slot(self.slots)
                task = asyncio.create_task(self.evict(entry, slot, run, wave_by))
                task.add_done_callback(slot.release)  # also when it is cancelled before it ever ran
                running.add(task)
            del rest[:count]

    async def evict(
        self, entry: DrainPod, slot: Slot | None, run: DrainRun, wave_by: Callable[[], float] | None = None
    ) -> Eviction:
        """Evict one pod (:meth:`evict_until`), a surge first (:meth:`surge`); ``wave_by``: wave's end (None: last)."""
        surge = None if entry.surge is None else await self.surge(entry, run, wave_by)
        outcome = await self.evict_until(entry, run, slot, past_gate=surge is not None)
        if surge is not None and outcome.result in (EvictionOutcome.EVICTED, EvictionOutcome.GONE):
            await self.surges.end(surge)  # at once: a ReplicaSet that sees the pod go adds a pod of its own
        return outcome

    async def evict_until(
        self, entry: DrainPod, run: DrainRun, slot: Slot | None = None, *, past_gate: bool = False
    ) -> Eviction:
        """Evict one pod, retrying with backoff until :meth:`DrainBounds.final`: how it ended. While its workload's
        budget is closed (:attr:`gates`) it waits without its slot, counted as refused (``past_gate``: not at first)."""
        bounds = run.bounds
        delay = EVICTION_RETRY_S[0]
        blocking: str | None = None  # the PodDisruptionBudget whose refusal this pod counts in, if any
        first = past_gate
        try:
            while True:
                await run.confirm()
                closed = None if first else self.gates.closed(entry.owner, self.clock())
                if closed is not None:
                    if slot is not None:
                        slot.release()
                    blocking = self._recount(blocking, closed.budget)
                    if closed.until >= bounds.final(self.timing)[0]:
                        return self._evicted(entry, EvictionOutcome.PDB_BLOCKED, closed.message, blocking)
                    spread = random.uniform(0.0, 0.2) * closed.length_s
                    until = min(closed.until + spread, bounds.final(self.timing)[0])
                    await bounds.sleep(until - self.clock())
                    continue
                grace, cut = bounds.grace(entry.grace_s, self.timing, self.clock())
                granted = grace if cut or self.grace_s >= 0 else None
                gated, first = not first, False
                try:
                    if not await self._send(entry, granted, run.drain_id, slot, gated):
                        continue  # its budget refused another pod of the workload while it waited for QPS
                except KubeError as exc:
                    if exc.status == 429:
                        blocking = self._recount(blocking, budget_of(exc, entry.key[0]))
                        if blocking is not None and entry.owner is not None:
                            self.gates.refused(entry.owner, blocking, exc.message, self.clock())
                            continue  # the gate says when to try again
                    late = self.clock() + delay >= bounds.final(self.timing)[0]
                    ended = self._ended(entry, exc, blocking, late=late)
                    if ended is not None:
                        return ended
                    tightened = await bounds.sleep(delay * random.uniform(0.8, 1.2))
                    delay = EVICTION_RETRY_S[0] if tightened else min(delay * 2, EVICTION_RETRY_S[1])
                    continue  # a new end: try again now, with the new grace
                self.gates.accepted(entry.owner)
                await run.record(entry.key, POD_EVICTION)
                accepted = self._evicted(entry, EvictionOutcome.EVICTED, "evicted", grace_s=grace, cut=cut)
                run.accepted[entry.key] = accepted
                return accepted
        finally:
            self._recount(blocking, None)

    async def _send(
        self, entry: DrainPod, grace_s: int | None, drain_id: str, slot: Slot | None, gated: bool
    ) -> bool:
        """Ask for the eviction, then give the slot back: whether it was sent. ``gated``: its token first, then
        only through an open gate. Raises :class:`KubeError`."""
        try:
            if gated:
                await self.kube.limiter.acquire()
                if self.gates.closed(entry.owner, self.clock()) is not None:
                    self.kube.limiter.give_back()
                    return False
            await self.kube.evict(*entry.key, grace_s, drain=drain_id, taken=gated)
            return True
        finally:
            if slot is not None:
                slot.release()

    def _ended(self, entry: DrainPod, exc: KubeError, blocking: str | None, *, late: bool) -> Eviction | None:
        """The end for ``exc`` (``None``: retry): 404 gone, 500 several budgets; ``late``: 429 refused, else failed."""
        if exc.status == 404:
            return self._evicted(entry, EvictionOutcome.GONE, "gone")
        if exc.status == 500 and "more than one PodDisruptionBudget" in exc.message:
            detail = f"several PodDisruptionBudgets match it: {exc.message}"
            return self._evicted(entry, EvictionOutcome.ERROR, detail)
        if not late:
            return None
        if exc.status == 429:
            return self._evicted(entry, EvictionOutcome.PDB_BLOCKED, exc.message, blocking)
        return self._evicted(entry, EvictionOutcome.ERROR, f"{exc.status} {exc.reason}: {exc.message}")

    def _recount(self, current: str | None, budget: str | None) -> str | None:
        """Count the pod under ``budget`` instead of ``current`` (``None``: none) in :attr:`blocked`; ``budget``."""
        for name, change in ((current, -1), (budget, +1)):
            if name is None or budget == current:
                continue
            self.blocked[name] += change
            self.observer.drain_blocked(name, self.blocked[name])
            if self.blocked[name] <= 0:
                del self.blocked[name]
        return budget

    async def surge(
        self, entry: DrainPod, run: DrainRun, wave_by: Callable[[], float] | None = None
    ) -> Surge | None:
        """Scale the pod's Deployment up (:mod:`~queue_processor.drain.surge`), wait for the replica until
        ``evict_by()``: the surge to take back (in ``run.held``) or ``None``. Raises what the guard raises."""
        namespace, name = entry.key
        deployment, held, bounds = str(entry.surge), run.held, run.bounds
        grace = bounds.fixed(lambda: bounds.grace(entry.grace_s, self.timing, self.clock())[0])

        def evict_by() -> float:
            """When the eviction must start: its wave's or drain's end less its grace and :data:`WAVE_PAD_S`."""
            final = bounds.final(self.timing)[0]
            return (final if wave_by is None else min(final, wave_by())) - grace() - WAVE_PAD_S

        fallback = functools.partial(self._fallback, f"{namespace}/{name}")
        if evict_by() - self.clock() < SURGE_LEAST_S:
            fallback(SurgeResult.NO_TIME, "too little time before the eviction must start")
            return None
        await run.confirm()
        provisional = Surge(namespace, deployment, str(entry.uid), name)
        held.append(provisional)
        started = await self.surges.start(provisional, entry.labels or {}, room_s=evict_by() - self.clock())
        held.remove(provisional)
        if isinstance(started, SurgeResult):
            why = {
                SurgeResult.AUTOSCALED: "a HorizontalPodAutoscaler owns the replica count",
                SurgeResult.NO_TIME: "too little time for the Deployment's minReadySeconds",
            }
            fallback(started, why.get(started, "the Deployment cannot be scaled"))
            return None
        held.append(started)
        if evict_by() - self.clock() < started.min_ready_s + SURGE_LEAST_S:
            fallback(SurgeResult.NO_TIME, "too little time for the Deployment's minReadySeconds")
            return started
        return await self._wait_replacement(started, evict_by, run)

    async def _wait_replacement(
        self, started: Surge, evict_by: Callable[[], float], run: DrainRun
    ) -> Surge | None:
        """Poll the surged Deployment until its replacement is available or ``evict_by()``; as :meth:`surge`."""
        pod = f"{started.namespace}/{started.name}"
        poll = 0.25
        while self.clock() < evict_by():
            await run.confirm()
            ready = await self.surges.ready(started)
            if ready is None:
                run.held.remove(started)
                self._fallback(
                    pod, SurgeResult.UNAVAILABLE, "the Deployment is gone or no longer records the surge"
                )
                return None
            if ready:
                self.observer.surge(SurgeResult.SURGED)
                log.info("surge: the replacement is available: evicting", pod=pod)
                return started
            await run.bounds.sleep(min(poll, max(0.0, evict_by() - self.clock())))
            poll = min(poll * 1.5, 2.0)
        if self.surges.undone(started):
            self._fallback(pod, SurgeResult.UNDONE, "the owner set the Deployment's replica count back")
        else:
            self._fallback(pod, SurgeResult.NOT_READY, "the replacement was not available in time")
        return started

    def _fallback(self, pod: str, result: SurgeResult, why: str) -> None:
        self.observer.surge(result)
        log.warning(f"surge: {why}: evicted without a replacement first", pod=pod)

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

    def _evicted(
        self,
        entry: DrainPod,
        outcome: EvictionOutcome,
        detail: str,
        budget: str | None = None,
        *,
        grace_s: int | None = None,
        cut: bool = False,
    ) -> Eviction:
        self.observer.eviction(outcome)
        return Eviction(entry.key, outcome, detail, budget, grace_s, cut, self.clock())


class Running:
    """A drain's launchers and evictions; an ended eviction is kept as its outcome alone, its task let go."""

    def __init__(self, launchers: list[asyncio.Task[None]]) -> None:
        self.launchers = launchers
        self._evictions: list[asyncio.Task[Eviction] | Eviction] = []  # in the order they started

    def add(self, task: asyncio.Task[Eviction]) -> None:
        task.add_done_callback(functools.partial(self._keep_eviction, len(self._evictions)))
        self._evictions.append(task)

    def _keep_eviction(self, index: int, task: asyncio.Task[Eviction]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._evictions[index] = task.result()

    def outcomes(self) -> list[Eviction]:
        """Every eviction's outcome, in start order. Raises what an eviction raised, as ``task.result()``."""
        return [item if isinstance(item, Eviction) else item.result() for item in self._evictions]

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        held = (item for item in self._evictions if isinstance(item, asyncio.Task))
        return itertools.chain(self.launchers, held)

    def failure(self) -> BaseException | None:
        """The exception of the first launcher or eviction that failed (not cancelled), if one did."""
        for task in self:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def settled(self) -> None:
        """Wait until every launcher and eviction has ended; raise the first failure at once."""
        while (failure := self.failure()) is None and (pending := [t for t in self if not t.done()]):
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if failure is not None:
            raise failure
        for task in self:
            task.result()  # a cancellation raises here, as gather would
