"""The explorer's surge Deployment and its owner (real control plane only): a single-replica Deployment whose
pods ask for a replacement first (``queue-processor/drain: surge``), and what its owner does to its replica
count while our surges change it: a GitOps self-heal (Argo CD's ``selfHeal``, Flux's drift correction) that
sets the declared count back whenever the live one drifts, and a new declared count.

Judged here (for :func:`queue_processor_sandbox.explore.violations`):

- ``surge-unready``: within :data:`WINDOW_S` after the controller said a pod's replacement was available
  (``surge: the replacement is available: evicting``), the Deployment had no Ready pod, unless a node went
  (deleted, or with its instance) within :data:`NODE_GONE_SLACK_S` before, or the pods Ready just before were
  evicted by a surge that fell back (``evicted without a replacement first``): the replacement was not there
  after all, or the owner's count took it away;
- ``deployment-count``: once everything has settled, the Deployment's ``spec.replicas`` is the count its owner
  declared last, and no surge record is left on it; but where a replica was killed (SIGKILL) mid-surge, as
  documented (docs/kinds.md, "What it leaves behind"): its record entries stay, with one replica each in the
  count, until the next surge of the Deployment or the owner's count; and an owner's count written while
  surges held the Deployment at that very count reads as ours, and their take-backs may lower it (documented
  there too).

Kubernetes documents what the owner's write does ("Deployments": scaling; a ReplicaSet scaled down deletes
its pods that are not Ready first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from queue_processor.drain.surge import SurgeRecord, recorded_surges
from queue_processor_sandbox.environment import Sandbox
from queue_processor_sandbox.storyline import Step

__all__ = ["AVAILABLE", "FALLBACK", "NODE_GONE_SLACK_S", "WINDOW_S", "SurgeOwner"]

NAME = "checkout"
LABELS = {"app": "checkout"}
#: How often the self-heal looks at the live count (real seconds).
LOOK_S = 0.1
#: The controller's line when it evicts a surged pod because its replacement is available.
AVAILABLE = "surge: the replacement is available: evicting"
#: Real seconds before a pod left Ready within which a node that went excuses a Deployment left unready.
NODE_GONE_SLACK_S = 2.0
#: Real seconds after "the replacement is available" within which the Deployment must keep a Ready pod: the
#: replacement's ReplicaSet deletes a pod within a moment of a count written back.
WINDOW_S = 5.0
#: The end of the controller's line when a surge falls back to an eviction without a replacement (time ran short,
#: the owner set the count back): the Deployment may then rightly have no Ready pod for a while.
FALLBACK = "evicted without a replacement first"
#: The Deployment's minReadySeconds (real): its replacement is available this long after it is Ready, so that
#: the owner's write can come while a surge waits.
MIN_READY_S = 2


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
        self.unseen = 0  # surges holding the count the owner wrote when it wrote it (it reads as ours)
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
        drift: :meth:`tick`). An owner's count equal to the live one while surges hold it reads as the count
        our last write set: the take-backs of those surges may lower it (``unseen``)."""
        if step.kind == "owner-scale":
            self.declared = int(step.detail)
            found = self.kube.get_raw(self.path) or {}  # type: ignore[attr-defined]
            if int((found.get("spec") or {}).get("replicas") or 0) == self.declared:
                self.unseen = len(SurgeRecord.of(found).pods)
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
        least = self.declared - self.unseen
        left = [] if least <= replicas <= most else [f"replicas {replicas}, owner's {self.declared}"]
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
        fallbacks = {name for name, _ in _lines(lines, lambda event: event.endswith(FALLBACK))}
        unready = [
            name
            for name, at in _lines(lines, lambda event: event == AVAILABLE)
            if (went := self._unready_after(at)) is not None
            and not any(went[0] - NODE_GONE_SLACK_S <= gone <= went[0] for gone in self.gone)
            and not went[1] & fallbacks
        ]
        if unready:
            failed["surge-unready"] = (
                f"no Ready pod within {WINDOW_S:.0f} s of these evictions, said to have their replacement: {unready}"
            )
        return failed

    def _unready_after(self, claimed_at: float) -> tuple[float, frozenset[str]] | None:
        """The first moment within :data:`WINDOW_S` after ``claimed_at`` that the Deployment had no Ready pod, with
        the pods Ready just before; ``None`` when there was none."""
        before: frozenset[str] = frozenset()
        for at, ready in self.ready.history:
            if claimed_at <= at <= claimed_at + WINDOW_S and not ready:
                return at, before
            before = ready
        return None


def _lines(lines: list[dict[str, Any]], wanted: Callable[[str], bool]) -> list[tuple[str, float]]:
    """(pod name, wall-clock seconds) of each line whose event is ``wanted``."""
    found = []
    for line in lines:
        if wanted(str(line.get("event"))) and isinstance(line.get("pod"), str):
            stamp = datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()
            found.append((line["pod"].split("/", 1)[-1], stamp))
    return found
