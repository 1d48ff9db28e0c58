"""The explorer's surge Deployment and its owner (real control plane only): a single-replica Deployment whose
pods ask for a replacement first (``queue-processor/drain: surge``), and what its owner does to its replica
count while our surges change it: a GitOps self-heal (Argo CD's ``selfHeal``, Flux's drift correction) that
sets the declared count back whenever the live one drifts, and a new declared count.

Judged here (for :func:`queue_processor_sandbox.explore.violations`):

- ``surge-unready``: a pod evicted after the controller said its replacement was available (``surge: the
  replacement is available: evicting``) left the Deployment with no Ready pod, unless a node went (deleted,
  or with its instance) within :data:`NODE_GONE_SLACK_S` before: the replacement was not there after all;
- ``deployment-count``: once everything has settled, the Deployment's ``spec.replicas`` is the count its owner
  declared last, and no surge record is left on it; but where a replica was killed (SIGKILL) mid-surge, as
  documented (docs/kinds.md, "What it leaves behind"): its record entries stay, with one replica each in the
  count, until the next surge of the Deployment or the owner's count.

Kubernetes documents what the owner's write does ("Deployments": scaling; a ReplicaSet scaled down deletes
its pods that are not Ready first).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from queue_processor.drain.surge import SurgeRecord, recorded_surges
from queue_processor_sandbox.environment import Sandbox
from queue_processor_sandbox.storyline import Step

__all__ = ["AVAILABLE", "NODE_GONE_SLACK_S", "SurgeOwner"]

NAME = "checkout"
LABELS = {"app": "checkout"}
#: How often the self-heal looks at the live count (real seconds).
LOOK_S = 0.1
#: The controller's line when it evicts a surged pod because its replacement is available.
AVAILABLE = "surge: the replacement is available: evicting"
#: Real seconds before a pod left Ready within which a node that went excuses a Deployment left unready.
NODE_GONE_SLACK_S = 2.0
#: The Deployment's minReadySeconds (real): its replacement is available this long after it is Ready, so that
#: the owner's write can come while a surge waits.
MIN_READY_S = 1


class SurgeOwner:
    """The Deployment ``apps/checkout`` of one storyline on ``sandbox`` (a real control plane's), started on
    ``node``, and its owner: ``declared`` is the replica count the owner declares (1 at first)."""

    def __init__(self, sandbox: Sandbox, node: str) -> None:
        kube = sandbox.kube
        self.kube = kube
        self.namespace = sandbox.cluster.namespace
        self.declared = 1
        self.gone: list[float] = []  # wall-clock times nodes went
        self.heal_after_s: float | None = None  # the self-heal's delay once on (real seconds)
        self.heals = 0  # counts the self-heal set back
        self._drifted: float | None = None  # when the self-heal first saw the live count drift (monotonic)
        self._looked = 0.0
        kube.add_deployment(  # type: ignore[attr-defined]
            self.namespace,
            NAME,
            replicas=1,
            labels=LABELS,
            grace_s=1,
            annotations={"queue-processor/drain": "surge"},
            prefer_node=node,
            min_ready_s=MIN_READY_S,
        )
        self.ready = kube.track_ready(self.namespace, LABELS)  # type: ignore[attr-defined]

    @property
    def path(self) -> str:
        """The Deployment's API path."""
        return f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{NAME}"

    def apply(self, step: Step, scale: float) -> bool:
        """An ``owner-scale`` step (the owner declares ``step.detail`` replicas and writes them, a merge patch of
        ``spec.replicas`` as ``kubectl scale``), or ``self-heal`` (from now on the owner sets the declared count
        back ``step.detail`` simulated seconds, times ``scale`` real seconds each, after it sees the live count
        drift: :meth:`tick`)."""
        if step.kind == "owner-scale":
            self.declared = int(step.detail)
            self.kube.scale_deployment(self.namespace, NAME, self.declared)  # type: ignore[attr-defined]
        else:
            self.heal_after_s = float(step.detail) * scale
        return True

    def tick(self) -> None:
        """The self-heal, once on: every :data:`LOOK_S`, read the live count; once it has differed from the
        declared count for the self-heal's delay, write the declared count."""
        now = time.monotonic()
        if self.heal_after_s is None or now < self._looked + LOOK_S:
            return
        self._looked = now
        found = self.kube.get_raw(self.path)  # type: ignore[attr-defined]
        if not found or int((found.get("spec") or {}).get("replicas") or 0) == self.declared:
            self._drifted = None
        elif self._drifted is None:
            self._drifted = now
        elif now - self._drifted >= self.heal_after_s:
            self.kube.scale_deployment(self.namespace, NAME, self.declared)  # type: ignore[attr-defined]
            self._drifted, self.heals = None, self.heals + 1

    def node_gone(self) -> None:
        """A node went (its pods with it)."""
        self.gone.append(time.time())

    def settled(self, killed: bool) -> bool:
        """The Deployment is at the count its owner declared, with no surge recorded (``killed``: a replica was
        killed, whose surges may stay recorded)."""
        found = self.kube.get_raw(self.path)  # type: ignore[attr-defined]
        return bool(found) and self._left(found, killed) == []

    def _left(self, deployment: dict[str, Any], killed: bool) -> list[str]:
        replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
        most = self.declared + (len(SurgeRecord.of(deployment).pods) if killed else 0)
        left = [] if self.declared <= replicas <= most else [f"replicas {replicas}, owner's {self.declared}"]
        surges = recorded_surges(deployment)
        return left + ([f"surges recorded: {sorted(surges.values())}"] if surges and not killed else [])

    def verdicts(self, lines: list[dict[str, Any]], killed: bool) -> dict[str, str]:
        """The invariants this module judges, from the controllers' log ``lines`` and the Ready pods' history
        (``killed``: a replica was killed mid-storyline): invariant → what was seen, for those that failed."""
        self.ready.stop()
        failed: dict[str, str] = {}
        found = self.kube.get_raw(self.path)  # type: ignore[attr-defined]
        left = self._left(found, killed) if found else ["the Deployment is gone"]
        if left:
            failed["deployment-count"] = "; ".join(left)
        unready = [
            name
            for name, at in _claims(lines)
            if (left_at := self._left_unready(name, at)) is not None
            and not any(left_at - NODE_GONE_SLACK_S <= gone <= left_at for gone in self.gone)
        ]
        if unready:
            failed["surge-unready"] = (
                f"no Ready pod once these left, their replacement said available: {unready}"
            )
        return failed

    def _left_unready(self, pod: str, claimed_at: float) -> float | None:
        """When ``pod``, said to have its replacement available at ``claimed_at``, stopped being Ready and left
        none Ready, or ``None``."""
        for at, ready in self.ready.history:
            if at >= claimed_at and pod not in ready:
                return at if not ready else None
        return None


def _claims(lines: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """(pod name, wall-clock seconds) of each ``AVAILABLE`` line."""
    found = []
    for line in lines:
        if line.get("event") == AVAILABLE and isinstance(line.get("pod"), str):
            stamp = datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()
            found.append((line["pod"].split("/", 1)[-1], stamp))
    return found
