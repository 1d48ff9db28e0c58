"""Cordon, taint, label and drain one node, with kubectl-drain semantics.

One code path whatever USE_APISERVER_CACHE says (DESIGN.md rule 1): list the node's pods once
(``fieldSelector=spec.nodeName``; ``resourceVersion=0`` with the cache option), filter them with
:func:`queue_processor.drain.filters.plan_drain`, evict the chosen pods in parallel through the policy/v1
Eviction API — a 429 (a PodDisruptionBudget allows no disruption now) is retried with backoff, a 500 (several
budgets match) fails that pod, a 404 means it is gone — then wait until the pods are gone by re-listing the
node's pods (never a GET per pod), until the deadline. Draining is bounded by the drain budget (nodes drained
at once); cordoning never waits for it ("Safely Drain a Node", "API-initiated Eviction").
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from queue_processor.config import default
from queue_processor.drain.filters import DrainOptions, PodDecision, plan_drain, pod_key
from queue_processor.kube import KubeClient, KubeError
from queue_processor.observe.observer import NULL_OBSERVER, Observer

__all__ = ["TAINT_WRITE_ATTEMPTS", "DrainOutcome", "DrainResult", "Drainer", "EvictionOutcome"]

#: How many times a taint write is retried on a fresh read after a 409 Conflict (another writer changed the
#: node between our read and our write).
TAINT_WRITE_ATTEMPTS = 8

#: kubectl waits 5 s before retrying an eviction a PodDisruptionBudget refused; we start lower and back off.
EVICTION_RETRY_S = (1.0, 10.0)


class DrainOutcome(StrEnum):
    """How a drain ended, decided where it ends (the ``result`` label of
    ``queue_processor_drain_duration_seconds``)."""

    DRAINED = "drained"
    """Every pod to evict is gone."""
    TIMEOUT = "timeout"
    """Pods were still there at the deadline (PodDisruptionBudgets included)."""
    ERROR = "error"
    """A pod could not be evicted: the filters refused it, or its eviction failed."""


class EvictionOutcome(StrEnum):
    """How one pod's eviction ended, decided where it ends (the ``result`` label of
    ``queue_processor_evictions_total``)."""

    EVICTED = "evicted"
    """The Eviction API accepted it (201)."""
    GONE = "gone"
    """The pod was gone already (404)."""
    PDB_BLOCKED = "pdb-blocked"
    """A PodDisruptionBudget refused it (429) until the deadline."""
    ERROR = "error"
    """Another error (several budgets match the pod: 500; anything else until the deadline)."""


@dataclass
class DrainResult:
    """How a drain ended: ``completed`` when every pod to evict is gone; else ``reason``; ``outcome`` says
    which. ``evicted`` pods were evicted, ``blocked`` were refused by a PodDisruptionBudget until the
    deadline, ``failed`` got another error, ``skipped`` were left alone by the filters, ``remaining`` were
    still on the node at the end."""

    completed: bool
    outcome: DrainOutcome = DrainOutcome.TIMEOUT
    reason: str | None = None
    evicted: int = 0
    blocked: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[PodDecision] = field(default_factory=list)
    remaining: int = 0


class Drainer:
    """Node operations through a :class:`KubeClient`. ``budget`` bounds concurrent drains (DRAIN_BUDGET);
    ``grace_s`` is POD_TERMINATION_GRACE_PERIOD (-1: each pod's own); ``use_cache`` is USE_APISERVER_CACHE;
    ``clock`` returns seconds (monotonic); ``observer`` is told each eviction's outcome and the number of nodes
    draining."""

    def __init__(
        self,
        kube: KubeClient,
        options: DrainOptions,
        *,
        budget: int,
        grace_s: int = default("pod_termination_grace_period"),
        use_cache: bool = False,
        observer: Observer = NULL_OBSERVER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.options = options
        self.budget = asyncio.Semaphore(budget)
        self.grace_s = grace_s
        self.use_cache = use_cache
        self.observer = observer
        self.clock = clock
        self.draining = 0

    async def cordon(
        self,
        node: str,
        *,
        taints: Sequence[tuple[str, str, str]] = (),
        labels_if_absent: Mapping[str, str] | None = None,
    ) -> bool:
        """Mark the node unschedulable (``spec.unschedulable: true``) and, in the same request, add ``taints``
        (``(key, value, effect)``) and those of ``labels_if_absent`` the node does not carry yet (a value
        already there may be someone else's: it is never overwritten): one write for PreDrain and cordon.
        Idempotent. ``False`` when the node does not exist (404); raises :class:`KubeError` for other failures.

        Without taints or labels this is one strategic-merge patch. With them it is a read-modify-write (one
        read): ``Node.spec.taints`` has no patch merge key, so a patch that carries taints replaces the whole
        list on a real API server; the node is read, every taint but ours (same key and effect) is kept as it
        was, labels already present are left out, and the patch carries the read ``resourceVersion``, so a
        concurrent change answers 409 Conflict and the write is retried on a fresh read
        (:data:`TAINT_WRITE_ATTEMPTS` times)."""
        patch: dict[str, Any] = {"spec": {"unschedulable": True}}
        try:
            if taints or labels_if_absent:
                await self._read_modify_write(node, taints, patch, labels_if_absent or {})
            else:
                await self.kube.patch_node(node, patch)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def taint(self, node: str, key: str, value: str, effect: str) -> None:
        """Add (or update) one taint, keeping every other taint of the node (read-modify-write, see
        :meth:`cordon`). Raises :class:`KubeError` (404 when the node is gone)."""
        await self._read_modify_write(node, [(key, value, effect)], {}, {})

    async def _read_modify_write(
        self,
        node: str,
        taints: Sequence[tuple[str, str, str]],
        patch: dict[str, Any],
        labels_if_absent: Mapping[str, str],
    ) -> None:
        ours = [{"key": key, "value": value[:63], "effect": effect} for key, value, effect in taints]
        identities = {(taint["key"], taint["effect"]) for taint in ours}
        for attempt in range(TAINT_WRITE_ATTEMPTS):
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
            if labels:
                metadata["labels"] = labels
            spec = dict(patch.get("spec", {}))
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
        deadline: float,
        *,
        guard: Callable[[], Awaitable[None]] | None = None,
        evicted: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> DrainResult:
        """Evict the node's pods and wait until they are gone, or until ``deadline`` (a ``clock`` reading).
        Waits for a drain-budget slot first. ``guard`` is awaited before every eviction request: it raises to
        stop the drain (a node Lease no longer held, :meth:`queue_processor.leases.Claim.confirm`);
        ``evicted(namespace, name)`` after each eviction the API server accepted (it must not raise). Raises
        :class:`KubeError` when the pods cannot be listed, and whatever ``guard`` raises."""
        async with self.budget:
            self.draining += 1
            self.observer.draining(self.draining)
            try:
                return await self._drain(node, deadline, guard, evicted)
            finally:
                self.draining -= 1
                self.observer.draining(self.draining)

    async def _drain(
        self,
        node: str,
        deadline: float,
        guard: Callable[[], Awaitable[None]] | None,
        evicted: Callable[[str, str], Awaitable[None]] | None,
    ) -> DrainResult:
        pods = await self.kube.pods_on_node(node, cached=self.use_cache)
        plan = plan_drain(pods, self.options)
        # Keep names, not pod objects, for the rest of the drain: in a storm a thousand drains wait at once.
        result = DrainResult(completed=False, skipped=[replace(d, pod={}) for d in plan.skipped])
        if plan.errors:
            names = ", ".join(f"{d.namespace}/{d.name} ({d.reason})" for d in plan.errors)
            result.reason = f"cannot drain: {names}"
            result.outcome = DrainOutcome.ERROR
            return result
        to_evict = [pod_key(pod) for pod in plan.evict]
        waiting = {(pod_key(pod), pod["metadata"].get("uid")) for pod in plan.wait_for}
        del pods, plan
        outcomes = await asyncio.gather(*(self._evict(key, deadline, guard, evicted) for key in to_evict))
        for (namespace, name), (outcome, detail) in zip(to_evict, outcomes, strict=True):
            if outcome is EvictionOutcome.EVICTED:
                result.evicted += 1
            elif outcome is EvictionOutcome.PDB_BLOCKED:
                result.blocked += 1
            elif outcome is EvictionOutcome.ERROR:
                result.failed.append(f"{namespace}/{name}: {detail}")
        result.remaining = await self._wait_gone(node, waiting, deadline)
        if result.blocked or result.failed:
            result.reason = (
                f"{result.blocked} evictions refused by PodDisruptionBudgets, {len(result.failed)} failed"
            )
            result.outcome = DrainOutcome.ERROR if result.failed else DrainOutcome.TIMEOUT
        elif result.remaining:
            result.reason = f"{result.remaining} pods still on the node at the deadline"
        else:
            result.completed = True
            result.outcome = DrainOutcome.DRAINED
        return result

    async def _evict(
        self,
        key: tuple[str, str],
        deadline: float,
        guard: Callable[[], Awaitable[None]] | None,
        evicted: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> tuple[EvictionOutcome, str]:
        """Evict one pod, retrying 429s (and other errors) with backoff until ``deadline``: how it ended and
        what the API said."""
        namespace, name = key
        delay = EVICTION_RETRY_S[0]
        grace = None if self.grace_s < 0 else self.grace_s
        while True:
            if guard is not None:
                await guard()
            try:
                await self.kube.evict(namespace, name, grace)
            except KubeError as exc:
                if exc.status == 404:
                    return self._evicted(EvictionOutcome.GONE, "gone")
                if exc.status == 500 and "more than one PodDisruptionBudget" in exc.message:
                    return self._evicted(
                        EvictionOutcome.ERROR, f"several PodDisruptionBudgets match it: {exc.message}"
                    )
                if self.clock() + delay >= deadline:
                    if exc.status == 429:
                        return self._evicted(EvictionOutcome.PDB_BLOCKED, "blocked")
                    return self._evicted(EvictionOutcome.ERROR, f"{exc.status} {exc.reason}: {exc.message}")
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, EVICTION_RETRY_S[1])
                continue
            if evicted is not None:
                await evicted(namespace, name)
            return self._evicted(EvictionOutcome.EVICTED, "evicted")

    def _evicted(self, outcome: EvictionOutcome, detail: str) -> tuple[EvictionOutcome, str]:
        self.observer.eviction(outcome)
        return outcome, detail

    async def _wait_gone(self, node: str, waiting: set[tuple[tuple[str, str], Any]], deadline: float) -> int:
        """Re-list the node's pods until none of ``waiting`` (key, uid) is left or the deadline; the count
        left."""
        poll = 0.05
        while waiting:
            pods = await self.kube.pods_on_node(node)  # a quorum read: the cache may still show them
            present = {(pod_key(pod), pod["metadata"].get("uid")) for pod in pods}
            waiting &= present
            if not waiting or self.clock() >= deadline:
                break
            await asyncio.sleep(min(poll, max(0.0, deadline - self.clock())))
            poll = min(poll * 1.5, 2.0)
        return len(waiting)
