"""Replacement before eviction (SURGE_DRAINS, pod annotation ``queue-processor/drain: surge``).

Evicting the one pod of a single-replica Deployment, or a pod whose PodDisruptionBudget needs every replica,
means downtime until the replacement is Ready, or a drain that cannot finish. For a pod that asks for it, the
drain first scales the pod's Deployment one replica up, waits until the Deployment has one more *available*
replica than before (``status.availableReplicas``: Ready for ``minReadySeconds``), then evicts the pod through
the Eviction API as usual (its PodDisruptionBudget still has the last word), and as the eviction is accepted
scales the Deployment back down by the one replica it added (an eviction refused until the drain's end keeps
the replica until then).

Why this mechanism (docs/kinds.md, "Replacement before eviction", says the same to users):

- **A rollout restart** (a template annotation) replaces *every* pod of the Deployment, not the one on the
  draining node, leaves its annotation in the template (removing it rolls again) and shows a GitOps
  controller a template drift. Not used.
- **Scale up, then scale down with ``controller.kubernetes.io/pod-deletion-cost`` on the old pod** lets the
  ReplicaSet delete the old pod, without the Eviction API (no PodDisruptionBudget check) and with the pod's
  own grace period (no cut to the instance's end), and needs ``pods patch`` cluster-wide. Not used.
- **Scale up, evict, scale down** (this module): the pod leaves through the Eviction API like every other
  pod of the drain (budgets honoured, grace cut to the instance's end), and the rights are the Deployment's
  alone. When the ReplicaSet sees the evicted pod go before the scale-down reaches it, it may create one
  more pod, which the scale-down removes at once (the ReplicaSet deletes a pending or unready pod first:
  "ReplicaSet", https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#scaling-a-replicaset).

What it leaves behind: nothing once the drain ends. While it runs, the Deployment carries ``spec.replicas``
one higher and the annotation :data:`SURGE_RECORD_ANNOTATION` (:class:`SurgeRecord`, JSON: ``base``, the count
before the surges in progress, ``pods``, pod uid → pod name, one entry per surge, ``replicas``, the count our
last write set, and ``undone``), written in the same
request (a merge patch with the read ``resourceVersion`` as a precondition, so concurrent surges of one
Deployment, from two drains or two replicas, count exactly; each waits until every replica the surges added
is available). A replica is taken back only while the count is the one our last write set and above ``base``:
a count someone else set meanwhile is theirs, never lowered. The record is how a surge interrupted by a
SIGKILL, or by a Lease that changed hands, is taken over or back: the drain of the redelivered message finds
its pod's entry and does not scale again, and any later surge of the Deployment removes the entries whose pods
are gone, with the replicas they added.

A GitOps controller (Argo CD, Flux) that manages ``spec.replicas`` sees the Deployment out of sync while a surge
lasts; with self-heal it scales back at once. A count other than the one our last write set is the owner's
(:meth:`SurgeRecord.rebase`): kept, and the surges in progress are undone (their pods wait until their eviction
must start, ``undone``): exclude ``spec.replicas`` from its comparison, as for a HorizontalPodAutoscaler.

What it does not do: a Deployment whose replica count a HorizontalPodAutoscaler owns (any autoscaling/v2 HPA
of the namespace whose ``scaleTargetRef`` names it) is not scaled, since the autoscaler would undo it at its
next sync: the pod is evicted (``autoscaled``). StatefulSets cannot surge: a StatefulSet's replacement pod has
the same name and identity as the pod it replaces and cannot run beside it; their pods (and any pod not of a
Deployment) are evicted and reported once per workload.

Metric: ``queue_processor_surges_total{result}`` (:class:`~queue_processor.outcomes.SurgeResult`).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from queue_processor.kube import KubeClient
from queue_processor.outcomes import KubeError, SurgeResult

__all__ = [
    "SURGE_LEAST_S",
    "SURGE_RECORD_ANNOTATION",
    "SURGE_WRITE_ATTEMPTS",
    "Surge",
    "SurgeRecord",
    "Surges",
    "autoscaled",
    "label_selector",
    "recorded_surges",
    "selects",
]

#: The Deployment annotation that records the surges in progress: JSON ``{"<pod uid>": "<pod name>"}``.
SURGE_RECORD_ANNOTATION = "queue-processor/surge"

#: A surge starts only when the pod's eviction can wait at least this long (seconds) for the replacement, on
#: top of the Deployment's ``minReadySeconds``: less is not enough to schedule a pod and pass a readiness probe.
SURGE_LEAST_S = 10.0

#: Attempts of one read-modify-write of a Deployment, each after a 409 Conflict (another writer first).
SURGE_WRITE_ATTEMPTS = 8

log = structlog.get_logger("queue_processor.drain")

Obj = dict[str, Any]


@dataclass
class SurgeRecord:
    """What :data:`SURGE_RECORD_ANNOTATION` on a Deployment holds: ``base``, its ``spec.replicas`` before the first
    of the surges in progress; ``pods``, those surges whose replica is in the count (pod uid → pod name);
    ``replicas``, the ``spec.replicas`` our last write set; and ``undone``, surges whose replica the owner took
    out. A ``spec.replicas`` other than ``replicas`` was set by the Deployment's owner since (a GitOps
    controller's self-heal, ``kubectl scale``): that count is the owner's, taken as the new ``base``
    (:meth:`rebase`), every surge in progress is undone, and no take-back ever lowers it."""

    base: int
    pods: dict[str, str]
    replicas: int = 0
    undone: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, deployment: Mapping[str, Any]) -> SurgeRecord:
        """The record ``deployment`` carries (one without ``replicas``, from an earlier version, wrote ``base``
        plus one per surge); one with ``base`` and ``replicas`` its ``spec.replicas`` and no pods when it has
        none, or an unreadable one (never raises)."""
        spec = deployment.get("spec")
        replicas = int(spec.get("replicas", 1)) if isinstance(spec, Mapping) else 1
        metadata = deployment.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
        text = annotations.get(SURGE_RECORD_ANNOTATION) if isinstance(annotations, Mapping) else None
        try:
            found = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            found = None
        if not isinstance(found, dict):
            return cls(replicas, {}, replicas)
        pods, undone = _entries(found.get("pods")), _entries(found.get("undone"))
        if not pods and not undone:
            return cls(replicas, {}, replicas)
        base = _count(found.get("base"), replicas)
        return cls(base, pods, _count(found.get("replicas"), base + len(pods)), undone)

    def annotation(self) -> str | None:
        """The annotation's value (``None``: remove it, no surge is in progress)."""
        if not self.pods and not self.undone:
            return None
        text: dict[str, Any] = {"base": self.base, "pods": self.pods, "replicas": self.replicas}
        if self.undone:
            text["undone"] = self.undone
        return json.dumps(text, sort_keys=True)

    def rebase(self, replicas: int) -> bool:
        """Take ``replicas`` (the Deployment's ``spec.replicas`` now) as the owner's count when it is not the
        one our last write set: the new ``base``, every surge in progress undone. ``True`` when it was."""
        if replicas == self.replicas:
            return False
        self.undone.update(self.pods)
        self.pods, self.base, self.replicas = {}, replicas, replicas
        return True

    def take_back(self, replicas: int) -> int:
        """``replicas`` less the one replica a surge added, unless it is gone already (not above ``base``)."""
        return replicas - 1 if replicas > self.base else replicas

    def drop(self, uid: str, replicas: int) -> int:
        """Remove the surge ``uid``: the count it leaves (one less for a surge whose replica is in it)."""
        if self.pods.pop(uid, None) is not None:
            replicas = self.take_back(replicas)
        self.undone.pop(uid, None)
        return replicas

    def __contains__(self, uid: object) -> bool:
        return uid in self.pods or uid in self.undone


def _entries(found: object) -> dict[str, str]:
    return {str(uid): str(name) for uid, name in found.items()} if isinstance(found, dict) else {}


def _count(found: object, default: int) -> int:
    return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else default


def recorded_surges(deployment: Mapping[str, Any]) -> dict[str, str]:
    """The surges in progress that ``deployment``'s :data:`SURGE_RECORD_ANNOTATION` records, undone ones too
    (pod uid → pod name); empty when absent or unreadable (never raises)."""
    record = SurgeRecord.of(deployment)
    return {**record.pods, **record.undone}


def label_selector(selector: Mapping[str, Any]) -> str:
    """A ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions``) as the ``labelSelector`` query of a
    list ("Labels and Selectors", https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/)."""
    terms = [f"{key}={value}" for key, value in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = ",".join(expression.get("values") or [])
        terms.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": f"{key}",
                "DoesNotExist": f"!{key}",
            }.get(str(operator), f"{key}")
        )
    return ",".join(terms)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a ``metav1.LabelSelector`` selects a pod with ``labels`` (an empty selector selects nothing,
    as for a Deployment, whose selector may not be empty)."""
    match = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match and not expressions:
        return False
    if any(labels.get(key) != value for key, value in match.items()):
        return False
    for expression in expressions:
        key, operator, values = (
            expression.get("key"),
            expression.get("operator"),
            expression.get("values") or [],
        )
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(str(operator), False)
        if not ok:
            return False
    return True


def autoscaled(hpas: Sequence[Mapping[str, Any]], deployment: str) -> bool:
    """Whether one of ``hpas`` (a namespace's HorizontalPodAutoscalers) scales the Deployment ``deployment``."""
    for hpa in hpas:
        target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if target.get("kind") == "Deployment" and target.get("name") == deployment:
            return True
    return False


@dataclass(frozen=True)
class Surge:
    """A surge of Deployment ``namespace/deployment`` for the pod ``uid`` (``name``). It is ready for the pod's
    eviction once the Deployment's controller has seen the scale-up (``status.observedGeneration`` at least
    ``generation``) and ``status.availableReplicas`` is at least ``spec.replicas`` less ``missing``, the
    replicas of the Deployment's base count that were not available when the surge started: every replica the
    surges in progress added must be available, so two surges of one Deployment each wait for their own."""

    namespace: str
    deployment: str
    uid: str
    name: str
    missing: int = 0
    generation: int = 0
    min_ready_s: float = 0.0


class Surges:
    """The Deployment side of replacement before eviction, through a :class:`KubeClient`: :meth:`start` scales
    up (and takes back the surges a killed process left behind), :meth:`ready` says whether the replacement is
    available, :meth:`end` scales back down."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._told_undone: set[str] = set()  # uids of the surges whose undo was logged

    async def start(
        self,
        namespace: str,
        deployment: str,
        name: str,
        uid: str,
        labels: Mapping[str, str],
        *,
        room_s: float = math.inf,
    ) -> Surge | SurgeResult:
        """Scale ``namespace/deployment`` one replica up for pod ``name`` (``uid``, ``labels``), recording it:
        the :class:`Surge`, or why not (:attr:`SurgeResult.AUTOSCALED`; :attr:`SurgeResult.NO_TIME` when the
        Deployment's ``minReadySeconds`` and :data:`SURGE_LEAST_S` do not fit in ``room_s`` seconds, decided
        before any write; :attr:`SurgeResult.UNAVAILABLE` when the Deployment is gone, does not select the pod,
        or cannot be read or written). A pod recorded already (the drain of a redelivered message after a
        restart, or after a Lease changed hands) is not scaled for twice. A write that failed after the API
        server may have applied it is taken back. Never raises :class:`KubeError`."""
        try:
            return await self._start(namespace, deployment, name, uid, labels, room_s)
        except KubeError as exc:
            log.warning(
                "surge: the Deployment cannot be scaled: evicted without a replacement first",
                deployment=f"{namespace}/{deployment}",
                pod=f"{namespace}/{name}",
                error=str(exc),
            )
            await self.end(Surge(namespace, deployment, uid, name))  # in case the write was applied
            return SurgeResult.UNAVAILABLE

    async def _start(
        self,
        namespace: str,
        deployment: str,
        name: str,
        uid: str,
        labels: Mapping[str, str],
        room_s: float,
    ) -> Surge | SurgeResult:
        checked = False
        for attempt in range(SURGE_WRITE_ATTEMPTS):
            current = await self.kube.get_deployment(namespace, deployment)
            spec = (current or {}).get("spec") or {}
            if current is None or not selects(spec.get("selector") or {}, labels):
                log.warning(
                    "surge: the pod's Deployment is not there: evicted without a replacement first",
                    deployment=f"{namespace}/{deployment}",
                    pod=f"{namespace}/{name}",
                )
                return SurgeResult.UNAVAILABLE
            record = SurgeRecord.of(current)
            added = uid not in record
            if added and float(spec.get("minReadySeconds") or 0) + SURGE_LEAST_S > room_s:
                return SurgeResult.NO_TIME
            if not checked:
                if autoscaled(await self.kube.list_hpas(namespace), deployment):
                    return SurgeResult.AUTOSCALED
                checked = True
            replicas = int(spec.get("replicas", 1))
            available = int((current.get("status") or {}).get("availableReplicas") or 0)
            rebased = record.rebase(replicas)
            stale = await self._stale(namespace, spec, record, keep=uid)
            for gone in stale:
                replicas = record.drop(gone, replicas)
            if added:
                record.pods[uid] = name
                replicas += 1
            record.replicas = replicas
            missing = max(0, record.base - available)
            if not added and not stale and not rebased:  # recorded before: wait for that surge's replica
                return self._surge(current, namespace, deployment, uid, name, missing)
            written = await self._write(namespace, deployment, current, record, attempt)
            if written is None:
                continue
            where = log.bind(deployment=f"{namespace}/{deployment}")
            if rebased:
                where.info("surge: the owner set the Deployment's replica count: kept, earlier surges undone")
            if stale:
                where.info(
                    "surge: took back the replicas of surges whose pods are gone", pods=sorted(stale.values())
                )
            if added:
                where.info(
                    "surge: scaled up for a replacement before eviction",
                    pod=f"{namespace}/{name}",
                    replicas=replicas,
                    available_before=available,
                )
            return self._surge(written, namespace, deployment, uid, name, missing)
        return SurgeResult.UNAVAILABLE  # pragma: no cover - the loop returns or raises

    async def _write(
        self, namespace: str, deployment: str, current: Obj, record: SurgeRecord, attempt: int
    ) -> Obj | None:
        """Write ``record`` and its count (``record.replicas``) on ``current``'s resourceVersion, in one merge
        patch: the Deployment after it, or ``None`` after a 409 (another writer came first: read it again),
        but on the last of :data:`SURGE_WRITE_ATTEMPTS`. Raises :class:`KubeError`."""
        patch = {
            "metadata": {
                "resourceVersion": current["metadata"]["resourceVersion"],
                "annotations": {SURGE_RECORD_ANNOTATION: record.annotation()},
            },
            "spec": {"replicas": record.replicas},
        }
        try:
            return await self.kube.patch_deployment(namespace, deployment, patch)
        except KubeError as exc:
            if exc.status != 409 or attempt == SURGE_WRITE_ATTEMPTS - 1:
                raise
            await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
            return None

    @staticmethod
    def _surge(deployment: Obj, namespace: str, name: str, uid: str, pod: str, missing: int) -> Surge:
        spec = deployment.get("spec") or {}
        return Surge(
            namespace=namespace,
            deployment=name,
            uid=uid,
            name=pod,
            missing=missing,
            generation=int((deployment.get("metadata") or {}).get("generation") or 0),
            min_ready_s=float(spec.get("minReadySeconds") or 0),
        )

    async def _stale(
        self, namespace: str, spec: Mapping[str, Any], record: SurgeRecord, *, keep: str
    ) -> dict[str, str]:
        """The surges of ``record`` (but ``keep``) whose pods are gone: surges whose take-back never came."""
        others = {uid: pod for uid, pod in {**record.pods, **record.undone}.items() if uid != keep}
        if not others:
            return {}
        pods = await self.kube.pods_selected(namespace, label_selector(spec.get("selector") or {}))
        present = {str((pod.get("metadata") or {}).get("uid")) for pod in pods}
        return {uid: pod for uid, pod in others.items() if uid not in present}

    async def ready(self, surge: Surge) -> bool | None:
        """Whether the Deployment has the available replicas ``surge`` waits for, as its controller reports
        after seeing the scale-up; ``None`` when the surge is over: the Deployment is gone, or no longer
        records it (taken back by another). ``False`` when it cannot be read (never raises :class:`KubeError`),
        and for a surge the owner undid (:meth:`undone`)."""
        try:
            current = await self.kube.get_deployment(surge.namespace, surge.deployment)
        except KubeError:
            return False
        record = SurgeRecord.of(current) if current is not None else None
        if current is None or record is None or surge.uid not in record:
            return None
        replicas = int((current.get("spec") or {}).get("replicas", 1))
        if record.rebase(replicas) or surge.uid in record.undone:
            if surge.uid not in self._told_undone:
                self._told_undone.add(surge.uid)
                log.warning(
                    "surge: the owner set the Deployment's replica count: the pod waits until its eviction "
                    "must start, and goes without a replacement",
                    deployment=f"{surge.namespace}/{surge.deployment}",
                    pod=f"{surge.namespace}/{surge.name}",
                    replicas=replicas,
                )
            return False
        status = current.get("status") or {}
        observed = int(status.get("observedGeneration") or 0)
        return (
            observed >= surge.generation
            and int(status.get("availableReplicas") or 0) >= replicas - surge.missing
        )

    def undone(self, surge: Surge) -> bool:
        """Whether :meth:`ready` found ``surge`` undone by the Deployment's owner."""
        return surge.uid in self._told_undone

    async def end(self, surge: Surge) -> bool:
        """Take back the replica ``surge`` added, and its record entry, in one write: never below ``base``, and
        never a count the owner set since our last write (:meth:`SurgeRecord.rebase`). ``True`` when this call
        removed the entry (``False`` when it is gone already: taken back before, or by another replica's later
        surge, or the Deployment is gone). A failure is logged and left to the record (never raises
        :class:`KubeError`)."""
        self._told_undone.discard(surge.uid)
        try:
            for attempt in range(SURGE_WRITE_ATTEMPTS):
                current = await self.kube.get_deployment(surge.namespace, surge.deployment)
                record = SurgeRecord.of(current) if current is not None else None
                if current is None or record is None or surge.uid not in record:
                    return False
                before = int((current.get("spec") or {}).get("replicas", 1))
                record.rebase(before)
                replicas = record.replicas = record.drop(surge.uid, before)
                if await self._write(surge.namespace, surge.deployment, current, record, attempt) is None:
                    continue
                log.info(
                    "surge: scaled back down"
                    if replicas < before
                    else "surge: ended, the replica count left as it is",
                    deployment=f"{surge.namespace}/{surge.deployment}",
                    pod=f"{surge.namespace}/{surge.name}",
                    replicas=replicas,
                )
                return True
        except KubeError as exc:
            log.error(
                "surge: the Deployment could not be scaled back: the record on it is taken back by its next "
                "surge",
                deployment=f"{surge.namespace}/{surge.deployment}",
                pod=f"{surge.namespace}/{surge.name}",
                error=str(exc),
            )
        return False
