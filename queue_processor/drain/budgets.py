"""PodDisruptionBudgets as a drain meets them: pod health, the budget a 429 names, a budget's arithmetic in one line.
Pure. Sources: "Specifying a Disruption Budget for your Application", "API-initiated Eviction", and the API server's
``pkg/registry/core/pod/storage/eviction.go`` (its 429 carries a ``DisruptionBudget`` cause).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from queue_processor.drain.plan import is_terminating
from queue_processor.outcomes import KubeError

#: ``spec.unhealthyPodEvictionPolicy`` when a budget does not set it.
DEFAULT_UNHEALTHY_POLICY = "IfHealthyBudget"


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is Running, Ready and not terminating: "healthy" for a PodDisruptionBudget."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or is_terminating(pod):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


_BUDGET_CAUSE = re.compile(r"^The disruption budget (\S+) ")


def budget_of(error: KubeError, namespace: str) -> str | None:
    """``namespace/name`` of the PodDisruptionBudget a 429's ``DisruptionBudget`` cause names ("The disruption
    budget NAME ..."), or ``None``."""
    for cause in error.causes:
        if cause.get("reason") == "DisruptionBudget":
            match = _BUDGET_CAUSE.match(str(cause.get("message") or ""))
            if match:
                return f"{namespace}/{match.group(1)}"
    return None


def budget_arithmetic(pdb: Mapping[str, Any]) -> str:
    """A PodDisruptionBudget's spec and status in one line (``minAvailable 2, currentHealthy 2, ...,
    unhealthyPodEvictionPolicy IfHealthyBudget``; the policy defaults to :data:`DEFAULT_UNHEALTHY_POLICY`)."""
    spec = pdb.get("spec") or {}
    status = pdb.get("status") or {}
    parts = [
        f"{name} {spec[name]}" for name in ("minAvailable", "maxUnavailable") if spec.get(name) is not None
    ]
    parts += [
        f"{name} {status.get(name, 0)}"
        for name in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods")
    ]
    policy = spec.get("unhealthyPodEvictionPolicy") or DEFAULT_UNHEALTHY_POLICY
    return ", ".join([*parts, f"unhealthyPodEvictionPolicy {policy}"])
