"""The Kubernetes emulation's simulated controllers, acting on the :class:`~.store.ObjectStore`.

What they do, as the Kubernetes components they stand for:

- timers (:meth:`Controllers.schedule`, :meth:`Controllers.run_due_timers`): every delayed action, in simulated
  seconds turned into real ones by the :class:`~queue_processor_sandbox.clock.SandboxClock`;
- node lifecycle: a Node registers some time after its instance launched, then turns Ready;
- the kubelet's graceful pod termination: a deleted pod gets a ``deletionTimestamp`` and is removed when its
  grace period has passed ("Pod Lifecycle", termination of Pods);
- the ReplicaSet controller (a terminating or removed pod gets a replacement) and the DaemonSet controller (a
  pod on every node, recreated when deleted from a node that is still there);
- the scheduler: pending pods bound to the schedulable node with the fewest pods, Ready some time later;
- the disruption controller's PodDisruptionBudget status, and the policy/v1 Eviction subresource with its
  budget arithmetic ("API-initiated Eviction", pkg/registry/core/pod/storage/eviction.go);
- the pod objects those controllers create (:func:`pod_template`, :func:`new_pod`).

No locking here: every method expects the caller to hold the sandbox's lock.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.cluster import MANUAL_STATUS, eviction_record
from queue_processor_sandbox.kube.store import RESOURCES, Key, ObjectStore, now_iso
from queue_processor_sandbox.kube_logic import (
    ApiError,
    Obj,
    is_ready,
    is_terminating,
    owner,
    pdb_expected,
    pdb_status,
    pdb_status_of,
    selector_matches,
)

__all__ = ["Controllers", "Timer", "new_pod", "pod_template"]


@dataclass(order=True)
class Timer:
    """A delayed action: ``action`` (``remove-pod``, ``pod-ready``, ``register-node``, ``node-ready``,
    ``schedule-pending``) on the object at ``key``, due at ``at`` (the clock's real monotonic seconds); ``seq``
    keeps timers due at the same time in the order they were set."""

    at: float
    seq: int
    action: str = field(compare=False)
    key: Key = field(compare=False)
    payload: Any = field(compare=False, default=None)


#: The PriorityClasses every cluster has, and their values ("Pod Priority and Preemption"); the emulation knows
#: no others.
SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2_000_001_000, "system-cluster-critical": 2_000_000_000}


def pod_template(
    labels: dict[str, str], grace_s: int, empty_dir: bool = False, priority_class: str | None = None
) -> Obj:
    """``{"labels", "spec"}`` of a pod: one ``pause`` container, ``terminationGracePeriodSeconds`` =
    ``grace_s`` (real seconds), an ``emptyDir`` volume when ``empty_dir``, and ``priorityClassName`` with the
    ``priority`` the API server's Priority admission would set. Raises ``ValueError`` for a class other than
    :data:`SYSTEM_PRIORITY_CLASSES`."""
    spec: Obj = {
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        "terminationGracePeriodSeconds": grace_s,
    }
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    if priority_class is not None:
        if priority_class not in SYSTEM_PRIORITY_CLASSES:
            raise ValueError(f"no PriorityClass with name {priority_class} was found")
        spec["priorityClassName"] = priority_class
        spec["priority"] = SYSTEM_PRIORITY_CLASSES[priority_class]
    return {"labels": dict(labels), "spec": spec}


def new_pod(
    namespace: str,
    name: str,
    node: str,
    template: Obj,
    controller: Obj | None,
    phase: str = "Running",
) -> Obj:
    """A core/v1 Pod from a :func:`pod_template` bound to ``node``, owned by ``controller`` (a ReplicaSet or
    DaemonSet; ``None`` for none); Ready when ``phase`` is Running. Not stored."""
    metadata: Obj = {"name": name, "namespace": namespace, "labels": dict(template["labels"])}
    if controller is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": RESOURCES[
                    "replicasets" if controller["kind"] == "ReplicaSet" else "daemonsets"
                ].group_version,
                "kind": controller["kind"],
                "name": controller["metadata"]["name"],
                "uid": controller["metadata"]["uid"],
                "controller": True,
            }
        ]
    ready = "True" if phase == "Running" else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {**copy.deepcopy(template["spec"]), "nodeName": node},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


class Controllers:
    """The simulated controllers over ``store``. ``clock`` scales every simulated duration; ``pod_start_s``
    (simulated seconds) is how long a scheduled pod takes to become Ready. Every eviction is recorded in
    ``evictions`` (the pod as it was just before), ``first_eviction`` and ``last_eviction`` (node name → aware
    UTC time)."""

    def __init__(
        self,
        store: ObjectStore,
        clock: SandboxClock,
        *,
        pod_start_s: float,
        evictions: list[Obj],
        last_eviction: dict[str, datetime],
        first_eviction: dict[str, datetime] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.pod_start_s = pod_start_s
        self.evictions = evictions
        self.last_eviction = last_eviction
        self.first_eviction = first_eviction if first_eviction is not None else {}
        self.timers: list[Timer] = []
        self._seq = itertools.count()
        self._schedulable: tuple[int, list[str]] = (-1, [])
        self._verdicts: dict[Key, tuple[Obj, bool]] = {}  # node key → (the node object judged, schedulable)
        self._scheduling_due = False

    # ------------------------------------------------------------------------------------------- timers

    def schedule(self, delay_s: float, action: str, key: Key, payload: Any = None) -> None:
        """Run ``action`` on ``key`` ``delay_s`` simulated seconds from now (see :class:`Timer`)."""
        self.schedule_real(self.clock.real(delay_s), action, key, payload)

    def schedule_real(self, delay_s: float, action: str, key: Key, payload: Any = None) -> None:
        """Run ``action`` on ``key`` ``delay_s`` real seconds from now."""
        at = self.clock.monotonic() + delay_s
        heapq.heappush(self.timers, Timer(at, next(self._seq), action, key, payload))

    def run_due_timers(self) -> None:
        """Run every timer that is due, in order."""
        objects = self.store.objects
        now = self.clock.monotonic()
        while self.timers and self.timers[0].at <= now:
            timer = heapq.heappop(self.timers)
            if timer.action == "remove-pod":
                pod = objects["pods"].get(timer.key)
                if pod is not None and pod["metadata"].get("uid") == timer.payload:
                    self.store.remove("pods", timer.key)
            elif timer.action == "pod-ready":
                pod = objects["pods"].get(timer.key)
                if pod is not None and not is_terminating(pod):
                    ready = copy.deepcopy(pod)
                    ready["status"] = {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    }
                    self.store.replace("pods", timer.key, ready)
            elif timer.action == "register-node":
                node, ready_after_s = timer.payload
                if timer.key not in objects["nodes"]:
                    self.store.insert("nodes", node)
                    for ds in list(objects["daemonsets"].values()):
                        self.daemon_pod(ds, node["metadata"]["name"])
                if ready_after_s is not None:  # None: registered, never Ready
                    self.schedule(ready_after_s, "node-ready", timer.key)
            elif timer.action == "node-ready":
                node = objects["nodes"].get(timer.key)
                if node is not None:
                    ready = copy.deepcopy(node)
                    ready["status"]["conditions"] = [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"}
                    ]
                    self.store.replace("nodes", timer.key, ready)
            elif timer.action == "schedule-pending":
                self._scheduling_due = False
                self.schedule_pending()

    # ------------------------------------------------------------------ DaemonSet, kubelet, ReplicaSet

    def daemon_pod(self, ds: Obj, node: str) -> None:
        """The DaemonSet controller: ``ds``'s pod on ``node``, unless it is there already."""
        name = f"{ds['metadata']['name']}-{node}"[:253]
        key = (ds["metadata"]["namespace"], name)
        if key in self.store.objects["pods"]:
            return
        template = ds["spec"]["template"]
        pod = new_pod(
            ds["metadata"]["namespace"],
            name,
            node,
            {"labels": template["metadata"]["labels"], "spec": template["spec"]},
            ds,
        )
        self.store.insert("pods", pod)

    def after_pod_gone(self, pod: Obj) -> None:
        """A pod was removed: a DaemonSet recreates its pod on a node that is still there; a ReplicaSet
        replaces it (also when it went with its node: pod GC deletes the pods of a deleted Node)."""
        reference = owner(pod)
        if reference and reference["kind"] == "ReplicaSet":
            self.replace_for_rs(pod)
        if reference and reference["kind"] == "DaemonSet":
            ds = self.store.objects["daemonsets"].get((pod["metadata"]["namespace"], reference["name"]))
            node = pod["spec"].get("nodeName")
            if ds is not None and node and ("", node) in self.store.objects["nodes"]:
                self.daemon_pod(ds, node)

    def start_terminating(self, key: Key, grace_s: int | None) -> Obj:
        """Begin the graceful deletion of a pod (lock held): set deletionTimestamp, remove it after the grace
        period (the pod's own when ``grace_s`` is None; real seconds, as the API's grace periods are everywhere
        in the emulation, as on a real API server), and let its ReplicaSet replace it."""
        pod = self.store.objects["pods"][key]
        own_grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        grace = own_grace if grace_s is None or grace_s < 0 else grace_s
        if is_terminating(pod):
            current = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            if grace >= current:
                return pod
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if grace == 0 or finished or not pod["spec"].get("nodeName"):  # nothing runs it: gone at once
            removed = self.store.remove("pods", key) or pod
            self.replace_for_rs(removed)
            return removed
        terminating = copy.deepcopy(pod)
        terminating["metadata"]["deletionTimestamp"] = (
            datetime.now(UTC) + timedelta(seconds=grace)
        ).strftime("%Y-%m-%dT%H:%M:%SZ")
        terminating["metadata"]["deletionGracePeriodSeconds"] = grace
        terminating = self.store.replace("pods", key, terminating)
        if (pod["metadata"].get("annotations") or {}).get(
            MANUAL_STATUS
        ) != "manual":  # else no kubelet ends it
            self.schedule_real(grace, "remove-pod", key, pod["metadata"]["uid"])
        if not is_terminating(pod):
            self.replace_for_rs(terminating)
        return terminating

    def replace_for_rs(self, pod: Obj) -> None:
        """The ReplicaSet controller: a terminating or removed pod of a ReplicaSet gets a replacement."""
        reference = owner(pod)
        if not reference or reference["kind"] != "ReplicaSet":
            return
        namespace = pod["metadata"]["namespace"]
        rs = self.store.objects["replicasets"].get((namespace, reference["name"]))
        if rs is None:
            return
        active = len(self.store.active_by_owner.get(rs["metadata"]["uid"], ()))
        for _ in range(int(rs["spec"].get("replicas", 0)) - active):
            spec = {
                k: v for k, v in pod["spec"].items() if k != "nodeName"
            }  # the template's, as the pod got it
            template = {"labels": rs["spec"]["selector"]["matchLabels"], "spec": spec}
            replacement = new_pod(
                namespace,
                self.store.free_name("pods", namespace, f"{rs['metadata']['name']}-"),
                "",
                template,
                rs,
                phase="Pending",
            )
            replacement["spec"].pop("nodeName", None)
            self.store.insert("pods", replacement)
        self.schedule_soon()

    # --------------------------------------------------------------------------------------- scheduler

    @staticmethod
    def _schedulable_node(node: Obj) -> bool:
        """Whether ``node`` is Ready, not cordoned and without a NoSchedule or NoExecute taint."""
        spec, status = node.get("spec") or {}, node.get("status") or {}
        if spec.get("unschedulable"):
            return False
        if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or []):
            return False
        return any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )

    def schedulable_nodes(self) -> list[str]:
        """Names of the Ready, schedulable, untainted nodes, in the store's order (recomputed only after a node
        changed, and then judging again only the nodes whose object changed: a storm's cordons write a node
        at a time)."""
        if self._schedulable[0] == self.store.writes["nodes"]:
            return self._schedulable[1]
        nodes = []
        verdicts: dict[Key, tuple[Obj, bool]] = {}
        for key, node in self.store.objects["nodes"].items():
            seen = self._verdicts.get(key)
            if seen is None or seen[0] is not node:  # objects are replaced, never changed in place
                seen = (node, self._schedulable_node(node))
            verdicts[key] = seen
            if seen[1]:
                nodes.append(node["metadata"]["name"])
        self._verdicts = verdicts
        self._schedulable = (self.store.writes["nodes"], nodes)
        return nodes

    def schedule_soon(self) -> None:
        """Run the scheduler at the next turn of the timers (the real scheduler, too, binds a pod a moment after
        it was created): the pods created meanwhile are bound in one pass."""
        if not self._scheduling_due:
            self._scheduling_due = True
            self.schedule_real(0.0, "schedule-pending", ("", ""))

    def schedule_pending(self) -> None:
        """The scheduler: bind unscheduled pods, one after the other, each to the schedulable node with the
        fewest pods at that moment (the first in the store's order on a tie); they turn Ready ``pod_start_s``
        later. Pods with nowhere to go are retried every simulated second."""
        pods_by_node = self.store.pods_by_node
        pending = list(pods_by_node.get("", ()))
        if not pending:
            return
        nodes = self.schedulable_nodes()
        if not nodes:
            self.schedule(1.0, "schedule-pending", ("", ""))
            return
        fewest = [(len(pods_by_node.get(name, ())), index, name) for index, name in enumerate(nodes)]
        heapq.heapify(fewest)
        for key in pending:
            count, index, node = fewest[0]
            bound = copy.deepcopy(self.store.objects["pods"][key])
            bound["spec"]["nodeName"] = node
            self.store.replace("pods", key, bound)
            heapq.heapreplace(fewest, (count + 1, index, node))
            self.schedule(self.pod_start_s, "pod-ready", key)

    # ------------------------------------------------------------------------------------------- eviction

    def scale(self, reference: Obj) -> int:
        """The scale of a pod's controller (a ReplicaSet's replicas; 0 for other kinds)."""
        if reference["kind"] == "ReplicaSet":
            rs = self.store.objects["replicasets"].get((reference["namespace"], reference["name"]))
            if rs is not None:
                return int(rs["spec"].get("replicas", 0))
        return 0

    def pdb_status(self, pdb: Obj) -> Obj:
        """A PodDisruptionBudget's ``status`` as the disruption controller would write it now (see
        :func:`~queue_processor_sandbox.kube_logic.pdb_status`); a budget with one matchLabels label and no
        matchExpressions is computed from the store's counters, without a scan."""
        store = self.store
        namespace = pdb["metadata"]["namespace"]
        selector = (pdb.get("spec") or {}).get("selector")
        labels = (selector or {}).get("matchLabels") or {}
        index = (namespace, *next(iter(labels.items()))) if len(labels) == 1 else None
        owners = store.label_owners.get(index, {}) if index is not None else {}
        if index is not None and owners and not (selector or {}).get("matchExpressions"):
            # One-label budget (the common case): from the counters kept by ObjectStore.index_pod, no scan.
            spec = pdb.get("spec") or {}
            if spec.get("maxUnavailable") is None and not isinstance(spec.get("minAvailable"), str):
                expected = (
                    len(store.pods_by_label.get(index, ())) if spec.get("minAvailable") is not None else 0
                )
            else:
                expected = sum(
                    self.scale({"kind": by[0], "name": by[1], "namespace": namespace}) for by in owners if by
                )
            return pdb_status_of(pdb, store.label_ready.get(index, 0), expected)
        pods = store.select_pods(namespace, selector)
        return pdb_status(pdb, pods, pdb_expected(pdb, pods, self.scale))

    def evict(self, key: Key, body: Obj, dry_run: bool = False, agent: str = "") -> Obj:
        """The policy/v1 Eviction subresource, as pkg/registry/core/pod/storage/eviction.go decides: a pending,
        finished or terminating pod is deleted without a budget check; a pod under more than one budget is
        refused (500); an unready pod goes when the budget says AlwaysAllow, or when it is met and wants at
        least one healthy pod (IfHealthyBudget); otherwise the budget must allow a disruption (else 429).
        ``dryRun=All`` (in the body's deleteOptions or the query) checks everything and deletes nothing. The
        record of an eviction carries ``agent``, the request's User-Agent (:data:`EVICTED_BY`)."""
        pod = self.store.objects["pods"].get(key)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{key[1]}" not found', {"name": key[1], "kind": "pods"})
        options = body.get("deleteOptions") or {}
        dry_run = dry_run or "All" in (options.get("dryRun") or [])
        grace = options.get("gracePeriodSeconds")
        phase = (pod.get("status") or {}).get("phase")
        if not (is_terminating(pod) or phase in ("Pending", "Succeeded", "Failed")):
            labels = pod["metadata"].get("labels") or {}
            budgets = [
                pdb
                for (namespace, _), pdb in self.store.objects["poddisruptionbudgets"].items()
                if namespace == key[0] and selector_matches((pdb.get("spec") or {}).get("selector"), labels)
            ]
            if len(budgets) > 1:
                raise ApiError(
                    500,
                    "",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                )
            if budgets:
                budget = budgets[0]
                status = self.pdb_status(budget)
                policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
                unready_may_go = not is_ready(pod) and (
                    policy == "AlwaysAllow"
                    or (status["currentHealthy"] >= status["desiredHealthy"] and status["desiredHealthy"] > 0)
                )
                if not unready_may_go and status["disruptionsAllowed"] <= 0:
                    name = budget["metadata"]["name"]
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {name} needs {status['desiredHealthy']} "
                                    f"healthy pods and has {status['currentHealthy']} currently",
                                }
                            ]
                        },
                    )
        if dry_run:
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        self.evictions.append(eviction_record(pod, agent))
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            self.last_eviction[node] = datetime.now(UTC)
            self.first_eviction.setdefault(node, self.last_eviction[node])
        if phase not in ("Succeeded", "Failed") and not is_terminating(pod):
            marked = copy.deepcopy(pod)
            conditions = marked.setdefault("status", {}).setdefault("conditions", [])
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                    "lastTransitionTime": now_iso(),
                }
            )
            self.store.replace("pods", key, marked)
        self.start_terminating(key, None if grace is None else int(grace))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
