"""Replacement before eviction (SURGE_DRAINS, pod annotation ``queue-processor/drain: surge``; docs/kinds.md): the
pod's Deployment (unless an HPA scales it) is scaled up one replica; once one more is *available* the pod is evicted
and the Deployment scaled back. :data:`SURGE_RECORD_ANNOTATION` holds the count, written in one merge patch on the
read ``resourceVersion`` (another's count never lowered); a surge cut short (SIGKILL, lost Lease) is taken over/back."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from queue_processor.kube import KubeClient
from queue_processor.outcomes import KubeError, SurgeResult

#: The Deployment annotation recording the surges in progress (:class:`SurgeRecord`, JSON).
SURGE_RECORD_ANNOTATION = "queue-processor/surge"

#: Least wait for the replacement beyond ``minReadySeconds`` (seconds) for a surge to start: scheduling, probes.
SURGE_LEAST_S = 10.0

#: Attempts of one read-modify-write of a Deployment, each after a 409 Conflict (another writer first).
SURGE_WRITE_ATTEMPTS = 8

log = structlog.get_logger("queue_processor.drain")

Obj = dict[str, Any]


@dataclass
class SurgeRecord:
    """The JSON of :data:`SURGE_RECORD_ANNOTATION`: ``base`` (``spec.replicas`` before the surges), ``pods`` (surges
    counted in it, pod uid → name), ``replicas`` (our last write's count), ``undone`` (surges the owner took out)."""

    base: int
    pods: dict[str, str]
    replicas: int = 0
    undone: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, deployment: Mapping[str, Any]) -> SurgeRecord:
        """The record ``deployment`` carries, or an empty one at its ``spec.replicas`` when it has none or an
        unreadable one (a record without ``replicas`` counts ``base`` plus one per surge). Never raises."""
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
        """``True``, making ``replicas`` the ``base`` and undoing every surge, when it is not our last write's."""
        if replicas == self.replicas:
            return False
        self.undone.update(self.pods)
        self.pods, self.base, self.replicas = {}, replicas, replicas
        return True

    def drop(self, uid: str, replicas: int) -> int:
        """Remove the surge ``uid``: the count it leaves (one less for a surge whose replica is in it, unless that
        replica is gone already: not above ``base``)."""
        if self.pods.pop(uid, None) is not None and replicas > self.base:
            replicas -= 1
        self.undone.pop(uid, None)
        return replicas

    def __contains__(self, uid: object) -> bool:
        return uid in self.pods or uid in self.undone


def _entries(found: object) -> dict[str, str]:
    return {str(uid): str(name) for uid, name in found.items()} if isinstance(found, dict) else {}


def _count(found: object, default: int) -> int:
    return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else default


def recorded_surges(deployment: Mapping[str, Any]) -> dict[str, str]:
    """The surges ``deployment`` records, undone ones too (pod uid → name); empty if none. Never raises."""
    record = SurgeRecord.of(deployment)
    return {**record.pods, **record.undone}


def label_selector(selector: Mapping[str, Any]) -> str:
    """A ``metav1.LabelSelector`` as a list's ``labelSelector`` query ("Labels and Selectors")."""
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


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a ``LabelSelector`` (``matchLabels``; ``matchExpressions`` In, NotIn, Exists, DoesNotExist; another
    operator: nothing) selects ``labels``; empty: everything, ``None``: nothing (a budget's, "Labels and Selectors")."""
    if selector is None:
        return False
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, values = expression.get("key"), expression.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(str(expression.get("operator")), False)
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
    """A surge of ``namespace/deployment`` for pod ``uid`` (``name``): ready once the controller observed ``generation``
    and ``availableReplicas`` ≥ ``spec.replicas`` less ``missing`` (base replicas unavailable at start)."""

    namespace: str
    deployment: str
    uid: str
    name: str
    missing: int = 0
    generation: int = 0
    min_ready_s: float = 0.0


class Surges:
    """The Deployment side of replacement before eviction: :meth:`start`, :meth:`ready`, :meth:`end`."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._told_undone: set[str] = set()  # uids of the surges whose undo was logged
        self._writing: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def _writer(self, namespace: str, deployment: str) -> asyncio.Lock:
        """One read-modify-write of a Deployment at a time, else surges ending together lose to each other's 409s."""
        lock = self._writing.get((namespace, deployment))
        if lock is None:
            lock = self._writing[(namespace, deployment)] = asyncio.Lock()
        return lock

    async def start(
        self, surge: Surge, labels: Mapping[str, str], *, room_s: float = math.inf
    ) -> Surge | SurgeResult:
        """Scale ``surge``'s Deployment up one replica for its pod (``labels``; once per pod), recorded, taking back
        surges whose pods are gone: the :class:`Surge` to wait for, or the :class:`SurgeResult` why not
        (``NO_TIME``: ``minReadySeconds`` + :data:`SURGE_LEAST_S` > ``room_s`` seconds). Never raises KubeError."""
        try:
            async with self._writer(surge.namespace, surge.deployment):
                return await self._start(surge, labels, room_s)
        except KubeError as exc:
            log.warning(
                "surge: the Deployment cannot be scaled: evicted without a replacement first",
                deployment=f"{surge.namespace}/{surge.deployment}",
                pod=f"{surge.namespace}/{surge.name}",
                error=str(exc),
            )
            await self.end(surge)  # in case the write was applied
            return SurgeResult.UNAVAILABLE

    async def _start(self, surge: Surge, labels: Mapping[str, str], room_s: float) -> Surge | SurgeResult:
        namespace, deployment, name, uid = surge.namespace, surge.deployment, surge.name, surge.uid
        checked = False
        for attempt in range(SURGE_WRITE_ATTEMPTS):
            current = await self.kube.get_deployment(namespace, deployment)
            spec = (current or {}).get("spec") or {}
            selector = spec.get("selector") or {}  # an empty one selects nothing, as a Deployment's
            if current is None or not any(selector.values()) or not selector_matches(selector, labels):
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
            if not checked and autoscaled(await self.kube.list_hpas(namespace), deployment):
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
                return _waiting_for(surge, current, missing)
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
            return _waiting_for(surge, written, missing)
        return SurgeResult.UNAVAILABLE  # pragma: no cover - the loop returns or raises

    async def _write(
        self, namespace: str, deployment: str, current: Obj, record: SurgeRecord, attempt: int
    ) -> Obj | None:
        """Merge-patch ``record`` and ``record.replicas`` on ``current``'s resourceVersion: the Deployment, or
        ``None`` after a 409 but the last attempt. Raises :class:`KubeError`."""
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
        """Whether the replicas ``surge`` waits for are available; ``None`` when the surge is over (Deployment gone
        or no longer recording it); ``False`` when unreadable or undone by the owner. Never raises KubeError."""
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
        """Take back ``surge``'s replica and entry in one write, never below ``base`` nor an owner's count: ``True``
        when this call removed the entry. Failures are logged (never raises :class:`KubeError`)."""
        self._told_undone.discard(surge.uid)
        try:
            async with self._writer(surge.namespace, surge.deployment):
                return await self._end(surge)
        except KubeError as exc:
            log.error(
                "surge: the Deployment could not be scaled back: the record on it is taken back by its next "
                "surge",
                deployment=f"{surge.namespace}/{surge.deployment}",
                pod=f"{surge.namespace}/{surge.name}",
                error=str(exc),
            )
        return False

    async def _end(self, surge: Surge) -> bool:
        """One :meth:`end`, under the Deployment's writer. Raises :class:`KubeError`."""
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
        return False  # pragma: no cover - the loop returns or raises


def _waiting_for(surge: Surge, deployment: Obj, missing: int) -> Surge:
    """``surge`` as written on ``deployment``: what its replacement's readiness is judged by."""
    generation = int((deployment.get("metadata") or {}).get("generation") or 0)
    min_ready_s = float((deployment.get("spec") or {}).get("minReadySeconds") or 0)
    return dataclasses.replace(surge, missing=missing, generation=generation, min_ready_s=min_ready_s)
