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

from queue_processor.drain.filters import DrainOptions, PodDecision, plan_drain, pod_key
from queue_processor.kube import KubeClient, KubeError

__all__ = ["TAINT_WRITE_ATTEMPTS", "DrainOutcome", "DrainResult", "Drainer"]

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
    ``clock`` returns seconds (monotonic)."""

    def __init__(
        self,
        kube: KubeClient,
        options: DrainOptions,
        *,
        budget: int,
        grace_s: int = -1,
        use_cache: bool = False,
        on_eviction: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.options = options
        self.budget = asyncio.Semaphore(budget)
        self.grace_s = grace_s
        self.use_cache = use_cache
        self.on_eviction = on_eviction or (lambda result: None)
        self.clock = clock
        self.draining = 0

    async def cordon(
        self,
        node: str,
        *,
        taints: Sequence[tuple[str, str, str]] = (),
        labels: Mapping[str, str] | None = None,
    ) -> bool:
        """Mark the node unschedulable (``spec.unschedulable: true``) and, in the same request, add ``taints``
        (``(key, value, effect)``) and ``labels``: one write for PreDrain and cordon. Idempotent. ``False`` when
        the node does not exist (404); raises :class:`KubeError` for other failures.

        Without taints this is one strategic-merge patch. With taints it is a read-modify-write: ``Node.spec.taints``
        has no patch merge key, so a patch that carries taints replaces the whole list on a real API server; the
        node is read, every taint but ours (same key and effect) is kept as it was, and the patch carries the
        read ``resourceVersion``, so a concurrent change answers 409 Conflict and the write is retried on a
        fresh read (:data:`TAINT_WRITE_ATTEMPTS` times)."""
        spec: dict[str, Any] = {"unschedulable": True}
        patch: dict[str, Any] = {"spec": spec}
        if labels:
            patch["metadata"] = {"labels": dict(labels)}
        try:
            if taints:
                await self._write_taints(node, taints, patch)
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
        await self._write_taints(node, [(key, value, effect)], {})

    async def _write_taints(
        self, node: str, taints: Sequence[tuple[str, str, str]], patch: dict[str, Any]
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
            body = {
                **patch,
                "metadata": {
                    **patch.get("metadata", {}),
                    "resourceVersion": current["metadata"]["resourceVersion"],
                },
                "spec": {**patch.get("spec", {}), "taints": kept + ours},
            }
            try:
                await self.kube.patch_node(node, body)
                return
            except KubeError as exc:
                if exc.status != 409 or attempt == TAINT_WRITE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))

    async def drain(
        self, node: str, deadline: float, *, guard: Callable[[], Awaitable[None]] | None = None
    ) -> DrainResult:
        """Evict the node's pods and wait until they are gone, or until ``deadline`` (a ``clock`` reading).
        Waits for a drain-budget slot first. ``guard`` is awaited before every eviction request: it raises to
        stop the drain (a node Lease no longer held, :meth:`queue_processor.leases.Claim.confirm`). Raises
        :class:`KubeError` when the pods cannot be listed, and whatever ``guard`` raises."""
        async with self.budget:
            self.draining += 1
            try:
                return await self._drain(node, deadline, guard)
            finally:
                self.draining -= 1

    async def _drain(
        self, node: str, deadline: float, guard: Callable[[], Awaitable[None]] | None
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
        outcomes = await asyncio.gather(*(self._evict(key, deadline, guard) for key in to_evict))
        for (namespace, name), outcome in zip(to_evict, outcomes, strict=True):
            if outcome == "evicted":
                result.evicted += 1
            elif outcome == "blocked":
                result.blocked += 1
            elif outcome != "gone":
                result.failed.append(f"{namespace}/{name}: {outcome}")
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
        self, key: tuple[str, str], deadline: float, guard: Callable[[], Awaitable[None]] | None
    ) -> str:
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
                    self.on_eviction("gone")
                    return "gone"
                if exc.status == 500 and "more than one PodDisruptionBudget" in exc.message:
                    self.on_eviction("error")
                    return f"several PodDisruptionBudgets match it: {exc.message}"
                outcome = "blocked" if exc.status == 429 else f"{exc.status} {exc.reason}: {exc.message}"
                if self.clock() + delay >= deadline:
                    self.on_eviction("pdb-blocked" if exc.status == 429 else "error")
                    return outcome
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, EVICTION_RETRY_S[1])
                continue
            self.on_eviction("evicted")
            return "evicted"

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
