"""``queue-processor explain NODE``: what would block a drain of a node now (read-only, with the caller's credentials):
per pod the filters' verdict, drain policy, wave, grace, the PodDisruptionBudgets selecting it with their arithmetic,
and the answer to a dry-run eviction (``dryRun=All``, as ``kubectl drain --dry-run=server``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from queue_processor.drain.evictions import budget_arithmetic, budget_of
from queue_processor.drain.plan import (
    SYSTEM_CLUSTER_CRITICAL,
    DrainOptions,
    DrainOrder,
    Verdict,
    drain_policy,
    is_terminating,
    own_grace,
    plan_drain,
    wave_of,
)
from queue_processor.drain.surge import selector_matches
from queue_processor.kube import KubeClient
from queue_processor.outcomes import KubeError


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready, not terminating: "healthy" ("Specifying a Disruption Budget for your Application")."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or is_terminating(pod):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


@dataclass
class PodExplanation:
    """One pod: ``verdict``/``reason`` from the filters; ``wave`` (1 ordinary, 2 critical or ``last``, 0 not
    evicted); ``policy`` (``evict (unknown 'VALUE')`` for an unknown annotation); ``grace_s`` without a deadline
    (seconds); ``ready`` (healthy for a budget); ``budgets`` (``namespace/name: arithmetic``); ``eviction``, the
    dry-run's answer (``allowed`` or ``<status> <message>``); ``blocked``: that answer holds the drain up."""

    namespace: str
    name: str
    verdict: str
    reason: str
    wave: int = 0
    policy: str = ""
    grace_s: int = 0
    ready: bool = False
    budgets: list[str] = field(default_factory=list)
    eviction: str = ""
    blocked: bool = False


@dataclass
class NodeExplanation:
    """A node's drain as it would go now: ``found``, ``unschedulable`` (cordoned), ``pods`` (by wave), ``summary``."""

    node: str
    found: bool
    unschedulable: bool = False
    pods: list[PodExplanation] = field(default_factory=list)
    summary: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def explain_node(
    kube: KubeClient,
    node: str,
    options: DrainOptions,
    *,
    order: DrainOrder = DrainOrder.WAVES,
    critical_priority: int = SYSTEM_CLUSTER_CRITICAL,
    grace_override_s: int = -1,
) -> NodeExplanation:
    """What would block a drain of ``node`` now; :class:`KubeError` when its node, pods or budgets cannot be read."""
    found = await kube.get_node(node)
    if found is None:
        return NodeExplanation(node, False, summary=f"node {node} not found")
    explanation = NodeExplanation(node, True, bool((found.get("spec") or {}).get("unschedulable")))
    plan = plan_drain(await kube.pods_on_node(node), options)
    namespaces = sorted({d.namespace for d in plan.decisions if d.verdict is Verdict.EVICT})
    budgets = {namespace: await kube.list_pdbs(namespace) for namespace in namespaces}

    async def one(decision: Any) -> PodExplanation:
        pod = decision.pod
        labels = (pod.get("metadata") or {}).get("labels") or {}
        line = PodExplanation(decision.namespace, decision.name, str(decision.verdict), decision.reason)
        line.ready = is_ready(pod)
        if decision.verdict is not Verdict.EVICT:
            return line
        line.wave = wave_of(pod, order, critical_priority) + 1
        policy, unknown = drain_policy(pod)
        line.policy = str(policy) if unknown is None else f"{policy} (unknown {unknown!r})"
        line.grace_s = own_grace(pod, grace_override_s)
        line.budgets = [
            f"{decision.namespace}/{pdb['metadata']['name']}: {budget_arithmetic(pdb)}"
            for pdb in budgets.get(decision.namespace, [])
            if selector_matches((pdb.get("spec") or {}).get("selector"), labels)
        ]
        try:
            await kube.evict(decision.namespace, decision.name, dry_run=True)
            line.eviction = "allowed"
        except KubeError as exc:
            if exc.status == 404:
                line.eviction = "404 gone already"
                return line
            named = budget_of(exc, decision.namespace)
            detail = "; ".join(str(c.get("message")) for c in exc.causes if c.get("message"))
            line.eviction = f"{exc.status} {exc.message}" + (f" ({detail})" if detail else "")
            line.blocked = True
            if named is not None and not any(b.startswith(f"{named}:") for b in line.budgets):
                line.budgets.append(named)
        return line

    lines = await asyncio.gather(*(one(d) for d in plan.decisions))
    explanation.pods = sorted(lines, key=lambda p: (p.wave == 0, p.wave, p.namespace, p.name))
    explanation.summary = _summary(explanation, len(plan.errors))
    return explanation


def _summary(explanation: NodeExplanation, errors: int) -> str:
    """One line: what a drain would do now and what holds it up."""
    evict = [p for p in explanation.pods if p.verdict == Verdict.EVICT]
    blocked = [p for p in evict if p.blocked]
    waves = sorted({p.wave for p in evict})
    text = f"node {explanation.node}: {len(evict)} pods to evict in {len(waves)} wave(s)"
    text += f", {len(explanation.pods) - len(evict) - errors} left alone"
    if errors:
        return text + f"; {errors} pods forbid the drain (the filters say error): it would not start"
    if blocked:
        names = ", ".join(f"{p.namespace}/{p.name}" for p in blocked)
        return text + f"; {len(blocked)} evictions refused now ({names}): the drain would wait for them"
    return text + "; nothing blocks a drain now"
