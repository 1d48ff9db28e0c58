"""The storyline explorer: generated combinations of real events, faults and replicas, judged by the sandbox.

DESIGN.md rule 14, in the spirit of Jepsen's generated histories checked against invariants. Each seed makes a
:class:`~queue_processor_sandbox.storyline.Storyline` (3 to 10 nodes, one or two controller replicas, steps of
interruptions, scale-outs, warm-pool moves, stops and starts, budgets that block then relax, a node deleted
mid-drain, a replica paused or killed, API and AWS faults, duplicated and late deliveries; pods annotated
``queue-processor/drain: last``; for one seed in four, DRAIN_BUDGET_NON_URGENT=1). :func:`run` plays it
against a fresh sandbox, the controllers running as their own processes (``queue-processor run``), waits until
everything has settled, stops the controllers with SIGTERM, and checks the invariants (:func:`violations`),
from the sandbox's own record plus the controllers' logs for what only they can tell:

- ``lifecycle``: every lifecycle action ended with the result the rules give: a terminate action completed
  with CONTINUE (or cancelled with its instance), a launch completed with CONTINUE once its node was Ready, a
  launch whose node never turned Ready completed with its hook's DefaultResult (ABANDON here); none timed out,
  none left open;
- ``drained-twice``: no node drained twice (a pod evicted by two drains, :func:`~queue_processor_sandbox.run.judge`);
- ``daemonset-or-mirror``: no DaemonSet or mirror pod evicted;
- ``heartbeat-after-end``: no heartbeat after an action ended (or while nobody held its message);
- ``messages``: no message left, nothing in the dead-letter queue (the explorer sends no poison);
- ``returned``: every instance back in service (started again, or moved out of the warm pool, and not
  interrupted since) has a schedulable node without our taints, label or record;
- ``gone-undrained``: no instance went (its node deleted with it) with pods on it a drain would have evicted
  and that were not even terminating, unless its node was deleted on purpose, a budget was held (or relaxed
  less than an eviction retry before), one of those pods' own eviction was refused by its budget that recently
  (the drain honoured it), or a replica was paused or killed while it was interrupted (the message
  it held comes back to another only after its visibility timeout, which may outlast a notice);
- ``last-early``: no pod annotated ``queue-processor/drain: last`` evicted before an ordinary pod of its node
  (``last_pods_evicted_early`` of the judge, without pods their budget refused, found on a second look, or
  left on the node when their wave's time was up: the drain names them),
  in storylines without faults or budget holds: a refused or
  failed eviction retried later, or a last wave started early because only its time was left, may rightly
  reorder them there;
- ``lease-lost``: no Lease lost by a replica that was neither paused nor killed;
- ``cordon-undone``: no node given back while a drain of it ran, in any replica
  (:mod:`queue_processor_sandbox.log_judge`);
- ``surge-unready`` and ``deployment-count`` (storylines with a surge Deployment, the real control plane only):
  :mod:`queue_processor_sandbox.surge_owner`;
- ``process``: no traceback in any controller's log, and every controller stopped with SIGTERM exited 0 with
  its ``stopped`` line at zero (tasks, operations, heartbeats) — but one SIGTERM found before it wrote its
  first line (still importing, its handler not installed yet: seed 311 on a loaded machine, paused during
  its start), which held nothing.

``python -m queue_processor_sandbox.explore --seeds N --seed-from K`` (``make explore``) runs N seeds from K,
prints one line per storyline and, for a failure, the one command that replays it (``--seed K``), after
shrinking it to the fewest steps that still fail the same invariant (:func:`shrink`, delta debugging). It exits
1 when a storyline failed. Kubernetes faults need the emulation; with ``--kubernetes real`` they are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from random import Random
from typing import Any, Literal

from queue_processor.drain.drainer import LOOKED_AGAIN, WAVE_TIME_UP
from queue_processor.drain.evictions import EVICTION_RETRY_S, GATE_MOST_S
from queue_processor.watch import RECORD_ANNOTATION, RECORD_LABEL
from queue_processor_sandbox.cluster import ClusterSpec, drain_of
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.log_judge import cordons_undone
from queue_processor_sandbox.processes import QueueProcessor
from queue_processor_sandbox.run import judge, last_pods_evicted_early
from queue_processor_sandbox.storyline import Step, Storyline, generate
from queue_processor_sandbox.surge_owner import SurgeOwner

__all__ = ["SCALE", "Outcome", "main", "run", "shrink", "violations"]

#: Real seconds per simulated second: a Spot notice lasts 6 s.
SCALE = 0.05
#: The hooks' HeartbeatTimeout, terminate and launch, simulated seconds (60 s real): longer than a paused
#: replica's message takes to come back to another (its visibility timeout) plus a receive.
HOOK_TIMEOUT_S = 1200
#: How long everything may take to settle after the last step (real seconds): a hang guard.
SETTLE_S = 150.0
#: Settings of every controller process (real seconds).
CONTROLLER_ENV = {
    "SQS_MSG_VISIBILITY_TIMEOUT_SEC": "10",
    "RECEIVE_WAIT_TIME_SEC": "2",
    "SHUTDOWN_TIMEOUT_SEC": "10",
    "NODE_TERMINATION_GRACE_PERIOD": "60",
    "REQUEUE_BACKOFF_BASE_SEC": "1",
    "LAUNCH_READY_TIMEOUT_SEC": "8",
    "DRAIN_RELIST_AFTER": "0.25",
    "RETURN_CHECK_INTERVAL_SEC": "1",
    "POISON_VISIBILITY_TIMEOUT_SEC": "1",
    "NODE_LEASE_DURATION_SEC": "15",
    "TAINT_NODE": "true",
    "EXCLUDE_FROM_LOAD_BALANCERS": "true",
}
#: Taint keys that are ours (TAINT_NODE's, NTH's keys, and the out-of-service taint).
OUR_TAINTS = ("aws-node-termination-handler/", "node.kubernetes.io/out-of-service")
LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
LEASE_LOST = "the node's Lease was lost: requeued"
#: The first replica's own pod (:attr:`Storyline.own_slot`): a ReplicaSet's, as the chart's Deployment makes it.
OWN_APP = "queue-processor"
OWN_LABELS = {"app.kubernetes.io/name": "queue-processor"}
#: DELETE_AT_DEADLINE_LEAD of the storylines with DELETE_AT_DEADLINE (real seconds: a notice lasts 6).
DELETE_LEAD_S = 2.0


@dataclass
class Outcome:
    """How one storyline went: ``failed`` invariants (name → what was seen), the steps ``applied`` and
    ``skipped`` (their target was not in a state they apply to), and ``seconds`` (real)."""

    storyline: Storyline
    failed: dict[str, str] = field(default_factory=dict)
    applied: list[Step] = field(default_factory=list)
    skipped: list[Step] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every invariant held."""
        return not self.failed


@dataclass
class _Replica:
    """One controller replica: its current process, its processes before a kill, and whether it was ever
    paused or killed (its Leases may then be lost)."""

    name: str
    process: QueueProcessor | None = None
    earlier: list[QueueProcessor] = field(default_factory=list)
    disturbed: bool = False
    paused: bool = False
    stopped_while_starting: bool = False
    """SIGTERM found its current process before it had written a line: still importing, before its signal
    handler was installed (the default action ends it with -SIGTERM; it held nothing yet)."""


class _World:
    """A storyline being played: the sandbox, the replicas, the timeline of steps and follow-ups."""

    def __init__(
        self,
        sandbox: Sandbox,
        story: Storyline,
        workdir: Path,
        settings: dict[str, str] | None = None,
        before_step: Callable[[Step, Sandbox], None] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.before_step = before_step
        self.settings = {**CONTROLLER_ENV, **(settings or {})}
        self.story = story
        self.workdir = workdir
        self.outcome = Outcome(story)
        self.slots = [instance.instance_id for instance in sandbox.instances]
        self.nodes = {instance.instance_id: instance.private_dns_name for instance in sandbox.instances}
        self.groups = sorted({instance.asg_name or "" for instance in sandbox.instances})
        self.replicas = [_Replica(f"replica-{index}") for index in range(story.replicas)]
        self.t0 = time.monotonic()
        self._timeline: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.never_ready: set[str] = set()  # instances launched whose node never turns Ready
        self.returned: dict[str, float] = {}  # instance → when it came back into service (real)
        self.interrupted: dict[str, float] = {}  # instance → when it was last interrupted (real)
        self.deleted_on_purpose: set[str] = set()
        self.held: set[int] = set()  # apps whose budget is held now
        self.released_at = -1e9  # when a held budget last relaxed (real)
        self.quiet_after = 0.0  # when the sandbox's own timers (notice ends) have all fired (real)
        self.replacements = 0  # instances launched to keep capacity (keep_capacity)
        # When the second replica was paused or dead (real, from, until): its messages wait meanwhile.
        self.disturbances: list[list[float]] = []
        self.first_interrupted: dict[str, float] = {}  # instance → its first interruption (real)
        self._capacity_checked = 0.0
        self.held_ever: set[str] = set()  # nodes whose instance went while a budget was held
        self.gone_undrained: dict[str, str] = {}
        self.own_pod: str | None = None  # the first replica's pod, when the storyline places it on a node
        self.surge: SurgeOwner | None = None  # the surge Deployment and its owner (real control plane only)
        self.notice_ends: dict[str, float] = {}  # instance → when its last notice ends (real)
        self._rng = Random(story.seed + 1)
        self._published_seen = 0
        self._watch_deletions()

    # ------------------------------------------------------------------------------------------ replicas

    def start(self, replica: _Replica) -> None:
        extra = dict(self.settings)
        own = replica is self.replicas[0] and self.own_pod is not None
        name = self.own_pod if own and self.own_pod is not None else replica.name
        extra |= {"POD_NAME": name, "POD_NAMESPACE": self.sandbox.controller_namespace}
        if self.story.replicas > 1:
            extra["NODE_LEASES"] = "true"
        if self.story.delete_at_deadline:
            extra.setdefault("DELETE_AT_DEADLINE", "true")
            extra.setdefault("DELETE_AT_DEADLINE_LEAD", str(DELETE_LEAD_S))
        if self.story.non_urgent_budget:
            extra.setdefault("DRAIN_BUDGET_NON_URGENT", self.story.non_urgent_budget)
        if self.story.evictions_in_flight:
            extra.setdefault("EVICTIONS_IN_FLIGHT", self.story.evictions_in_flight)
        if self.surge is not None:
            extra.setdefault("SURGE_DRAINS", "true")
        replica.process = QueueProcessor(self.sandbox, self.workdir / f"{replica.name}.log", **extra)
        if own:
            # The kubelet's part: once its pod is evicted, SIGTERM (the controller left its drained node).
            self.sandbox.kubelet_for(self.sandbox.controller_namespace, name, replica.process.process.pid)

    def place_own_pod(self) -> None:
        """With :attr:`Storyline.own_slot`: the first replica's pod, a ReplicaSet's, on that slot's node."""
        if self.story.own_slot is None:
            return
        node = self.nodes[self._instance(self.story.own_slot)]
        (self.own_pod,) = self.sandbox.kube.add_replicaset(
            self.sandbox.controller_namespace, OWN_APP, nodes=[node], replicas=1, labels=OWN_LABELS, grace_s=1
        )

    def place_surge(self) -> None:
        """With :attr:`Storyline.surge_slot`, on the real control plane: the surge Deployment on that slot's
        node (the emulation runs no Deployments: its owner steps are skipped there)."""
        if self.story.surge_slot is not None and hasattr(self.sandbox.kube, "add_deployment"):
            self.surge = SurgeOwner(self.sandbox, self.nodes[self._instance(self.story.surge_slot)])

    def follow_own_pod(self) -> None:
        """The first replica left its drained node (the kubelet's SIGTERM ended it): its successor starts as
        the ReplicaSet's replacement pod, as a Deployment's would. Its exit is judged as any SIGTERM's; the time
        until the successor runs is a disturbance (its messages wait in the queue meanwhile)."""
        replica = self.replicas[0]
        process = replica.process
        if self.own_pod is None or process is None or process.process.poll() is None:
            return
        self.disturbances.append([time.monotonic(), float("inf")])
        verdict = exit_verdict(process.process.returncode, process.lines())
        if verdict is not None and verdict != "stopped-while-starting":
            self.fail("process", f"{replica.name} left its node and {verdict}")
        replica.earlier.append(process)
        namespace = self.sandbox.controller_namespace
        replacements = [
            pod["metadata"]["name"]
            for pod in self.sandbox.kube.objects("pods")
            if pod["metadata"]["namespace"] == namespace
            and pod["metadata"]["name"] != self.own_pod
            and (pod["metadata"].get("labels") or {}) == OWN_LABELS
            and not pod["metadata"].get("deletionTimestamp")
            and (pod.get("spec") or {}).get("nodeName")
        ]
        # Not placed yet: the successor is no pod of the cluster's.
        self.own_pod = min(replacements) if replacements else None
        self.start(replica)
        self.at((time.monotonic() - self.t0) / SCALE + 60, "successor-running", self._disturbance_over)

    def stop_all(self) -> None:
        """SIGCONT a paused replica, then SIGTERM every running one; each must exit 0 within 30 s."""
        for replica in self.replicas:
            process = replica.process
            if process is None:
                continue
            if replica.paused:
                process.process.send_signal(signal.SIGCONT)
                replica.paused = False
            try:
                code = process.stop(signal.SIGTERM, 30)
            except AssertionError as error:
                self.fail("process", f"{replica.name}: {error}")
                continue
            verdict = exit_verdict(code, process.lines())
            if verdict == "stopped-while-starting":
                replica.stopped_while_starting = True  # a loaded machine, a pause during its imports
            elif verdict is not None:
                self.fail("process", f"{replica.name} {verdict}")

    # ----------------------------------------------------------------------------------------- timeline

    def at(self, sim_s: float, what: str, action: Callable[[], None]) -> None:
        heapq.heappush(self._timeline, (self.t0 + sim_s * SCALE, next(self._seq), what, action))

    def play(self) -> None:
        """Apply every step (and its follow-ups) at its time; deliver duplicates meanwhile."""
        for step in self.story.steps:
            self.at(step.at_s, step.kind, functools.partial(self.apply, step))
        compact = getattr(self.sandbox.kube, "compact", None)  # the emulation's (etcd compaction, a restart)
        if self.story.compaction_at_s is not None and compact is not None:
            self.at(self.story.compaction_at_s, "compaction", functools.partial(compact, end_watches=True))
        while self._timeline:
            due, _, _, action = self._timeline[0]
            self.duplicate_new_messages()
            self.keep_capacity()
            self.follow_own_pod()
            if self.surge is not None:
                self.surge.tick()
            if time.monotonic() < due:
                time.sleep(min(0.05, due - time.monotonic()))
                continue
            heapq.heappop(self._timeline)
            action()

    def keep_capacity(self) -> None:
        """Do what the groups' desired capacity does: while fewer than half the storyline's nodes (at least two)
        are in service, running, not interrupted and schedulable, launch one more (through the launch hook),
        so that the pods of the instances that left have somewhere to go and the budgets can allow drains
        again. Checked every half second."""
        now = time.monotonic()
        if now < self._capacity_checked + 0.5:
            return
        self._capacity_checked = now
        aws, kube = self.sandbox.aws, self.sandbox.kube
        staying, launching = 0, 0
        for instance in aws.instances():
            lifecycle = aws.lifecycle_state(instance.instance_id) or ""
            if lifecycle.startswith("Pending"):
                launching += 1
                continue
            if lifecycle != "InService" or instance.instance_id in self.interrupted:
                continue
            node = kube.get("nodes", instance.private_dns_name)
            if node is not None and not (node.get("spec") or {}).get("unschedulable"):
                staying += 1
        if staying + launching < max(2, self.story.nodes // 2):
            group = self.groups[self.replacements % len(self.groups)]
            (launched,) = aws.launch_instances(group, 1)
            self.nodes[launched.instance_id] = launched.private_dns_name
            self.replacements += 1

    @property
    def killed(self) -> bool:
        """Whether a replica was killed (SIGKILL): what it held mid-surge may stay recorded."""
        return any(step.kind == "kill-replica" for step in self.outcome.applied)

    def fail(self, invariant: str, what: str) -> None:
        seen = self.outcome.failed.get(invariant)
        self.outcome.failed[invariant] = what if seen is None else f"{seen}; {what}"

    # ------------------------------------------------------------------------------------------- steps

    def _instance(self, slot: int) -> str:
        return self.slots[slot % len(self.slots)]

    def _state(self, instance_id: str) -> tuple[str, str]:
        """(Auto Scaling lifecycle state or "", EC2 state or "gone")."""
        aws = self.sandbox.aws
        try:
            ec2 = aws.ec2_state(instance_id)
        except Exception:  # moto forgot it
            ec2 = "gone"
        return aws.lifecycle_state(instance_id) or "", ec2

    def apply(self, step: Step) -> None:
        """Apply ``step`` when its target is in a state it applies to; record it either way."""
        if self.before_step is not None:
            self.before_step(step, self.sandbox)
        try:
            done = self._apply(step)
        except (ValueError, KeyError, LookupError) as error:  # a race with the sandbox's own timers
            done = False
            self.outcome.skipped.append(step)
            del error
            return
        (self.outcome.applied if done else self.outcome.skipped).append(step)

    def _apply(self, step: Step) -> bool:
        aws, kube, kind = self.sandbox.aws, self.sandbox.kube, step.kind
        now = time.monotonic()
        if kind in ("scale-out", "scale-out-never-ready"):
            group = self.groups[step.target % len(self.groups)]
            if kind == "scale-out-never-ready":
                self.sandbox.launches_never_ready(1)
            (launched,) = aws.launch_instances(group, 1)
            self.nodes[launched.instance_id] = launched.private_dns_name
            if kind == "scale-out-never-ready":
                self.never_ready.add(launched.instance_id)
            return True
        if kind == "from-warm-pool":
            group = self.groups[step.target % len(self.groups)]
            warmed = [
                i.instance_id
                for i in aws.instances(group)
                if (aws.lifecycle_state(i.instance_id) or "") == "Warmed:Stopped"
            ]
            if not warmed:
                return False
            (back,) = aws.launch_instances(group, 1, origin="WarmPool")
            self.returned[back.instance_id] = now
            return True
        if kind in ("pdb-hold", "pdb-release"):
            app = f"app-{step.target:03d}"
            kube.set_pdb(self.sandbox.cluster.namespace, app, max_unavailable=0 if kind == "pdb-hold" else 1)
            if kind == "pdb-hold":
                self.held.add(step.target)
            else:
                self.held.discard(step.target)
                self.released_at = now
            return True
        if kind in ("pause-replica", "resume-replica", "kill-replica", "stop-replica", "restart-replica"):
            return self._replica_step(step)
        if kind == "kube-fault":
            return self._kube_fault(step)
        if kind in ("self-heal", "owner-scale"):
            return self.surge is not None and self.surge.apply(step, SCALE)
        if kind == "aws-fault":
            code, operation, count = step.detail.split()
            status = 500 if code == "InternalError" else 400  # SQS failing a settlement, or a throttle
            message = "We encountered an internal error." if status == 500 else "Rate exceeded"
            aws.inject_error(operation, code, message, times=int(count.lstrip("x")), status=status)  # type: ignore[arg-type]
            return True
        instance_id = self._instance(step.target)
        lifecycle, ec2 = self._state(instance_id)
        if kind == "start":
            if ec2 != "stopped" or lifecycle.startswith("Warmed"):
                return False
            aws.start_instance(instance_id)
            self.returned[instance_id] = now
            return True
        if kind == "delete-node":
            node = self.nodes[instance_id]
            if kube.get("nodes", node) is None:
                return False
            self.deleted_on_purpose.add(node)
            kube.delete_node(node)
            return True
        if ec2 != "running" or lifecycle not in ("InService", ""):
            return False
        self.interrupted[instance_id] = now
        self.first_interrupted.setdefault(instance_id, now)
        if kind == "rebalance":
            aws.rebalance_recommendation(instance_id)
        elif kind in ("spot", "spot-stop", "spot-hibernate"):
            action = {"spot": "terminate", "spot-stop": "stop", "spot-hibernate": "hibernate"}[kind]
            aws.spot_interruption(instance_id, action=action)
            self.quiet_after = max(self.quiet_after, now + (120 + 5) * SCALE)
            self.notice_ends[instance_id] = now + 120 * SCALE
        elif kind == "scale-in":
            if lifecycle != "InService":
                return False
            aws.terminate_instance(instance_id)
        elif kind == "to-warm-pool":
            if lifecycle != "InService":
                return False
            aws.terminate_instance(instance_id, to_warm_pool=True)
        elif kind == "stop":
            aws.stop_instance(instance_id)
        elif kind == "health":
            start_in = float(step.detail or 120)
            aws.scheduled_change([instance_id], start_in_s=start_in, duration_s=600)
            started = self._launch_time(instance_id)
            self.at(step.at_s + start_in, "retire", lambda: self._retire(instance_id, started))
            self.notice_ends[instance_id] = now + start_in * SCALE
        elif kind == "capacity-reservation":
            notice = float(step.detail or 120)
            aws.capacity_reservation_interruption(instance_id, notice_s=notice)
            self.quiet_after = max(self.quiet_after, now + (notice + 5) * SCALE)
            self.notice_ends[instance_id] = now + notice * SCALE
        return True

    def _retire(self, instance_id: str, launched: datetime | None) -> None:
        """AWS retires the instance at the scheduled change's start, unless it was stopped and started since
        the change was scheduled (its ``LaunchTime`` changed): a start moves an EBS-backed instance to other
        hardware, which ends its retirement ("Instance retirement", EC2 User Guide)."""
        if (
            self._state(instance_id)[1] in ("running", "stopped")
            and self._launch_time(instance_id) == launched
        ):
            self.sandbox.aws.terminate_ec2_instance(instance_id)

    def _launch_time(self, instance_id: str) -> datetime | None:
        """EC2's ``LaunchTime`` of the instance (its last launch or start), ``None`` when EC2 has forgotten it."""
        try:
            reservations = self.sandbox.aws.client("ec2").describe_instances(InstanceIds=[instance_id])
            return reservations["Reservations"][0]["Instances"][0].get("LaunchTime")  # type: ignore[no-any-return]
        except Exception:  # gone
            return None

    def _disturbance_over(self) -> None:
        if self.disturbances and self.disturbances[-1][1] == float("inf"):
            self.disturbances[-1][1] = time.monotonic()

    def _replica_step(self, step: Step) -> bool:
        if len(self.replicas) < 2:
            return False
        replica = self.replicas[1]
        process = replica.process
        if step.kind == "pause-replica" and process is not None and not replica.paused:
            process.process.send_signal(signal.SIGSTOP)
            replica.paused = replica.disturbed = True
            self.disturbances.append([time.monotonic(), float("inf")])
            return True
        if step.kind == "resume-replica" and process is not None and replica.paused:
            process.process.send_signal(signal.SIGCONT)
            replica.paused = False
            self._disturbance_over()
            return True
        if step.kind in ("kill-replica", "stop-replica") and process is not None:
            if step.kind == "kill-replica":
                process.process.kill()
                process.process.wait()
                process.log.close()
            else:  # a graceful stop mid-storyline (a rolling update): it must exit 0, as at the end
                try:
                    code = process.stop(signal.SIGTERM, 30)
                except AssertionError as error:
                    self.fail("process", f"{replica.name}: {error}")
                else:
                    verdict = exit_verdict(code, process.lines())
                    if verdict is not None and verdict != "stopped-while-starting":
                        self.fail("process", f"{replica.name} stopped mid-storyline: {verdict}")
            replica.earlier.append(process)
            replica.process, replica.paused, replica.disturbed = None, False, True
            self.disturbances.append([time.monotonic(), float("inf")])
            return True
        if step.kind == "restart-replica" and process is None:
            self.start(replica)
            self._disturbance_over()
            return True
        return False

    def _kube_fault(self, step: Step) -> bool:
        inject: Callable[..., None] | None = getattr(self.sandbox.kube, "inject_fault", None)
        if inject is None:
            return False
        how, verb, resource, count = step.detail.split()
        shapes: dict[str, dict[str, Any]] = {
            "500": {"status": 500},
            "429": {"status": 429, "retry_after_s": 1},
            "slow": {"delay_s": 1.0},
        }
        options = shapes.get(how, {"reset": True})
        try:
            inject(verb, resource, count=int(count.lstrip("x")), **options)
        except NotImplementedError:  # the real control plane has no injector
            return False
        return True

    def duplicate_new_messages(self) -> None:
        """Deliver again, later, some of what the sandbox published since the last look."""
        if not self.story.duplicates:
            return
        aws = self.sandbox.aws
        published = aws.published()
        assert self.sandbox.queue is not None
        url = self.sandbox.queue.url
        for message in published[self._published_seen :]:
            if message.via != "raw" and message.queues and self._rng.random() < self.story.duplicates:
                body = message.body
                delay = self._rng.uniform(0, self.story.duplicate_delay_s)
                elapsed = (time.monotonic() - self.t0) / SCALE
                self.at(elapsed + delay, "duplicate", functools.partial(aws.send_raw, url, body))
        self._published_seen = len(published)

    # --------------------------------------------------------------------------------------- the record

    def _watch_deletions(self) -> None:
        """Note, when a node goes with its instance, the pods a drain would have evicted and that were not even
        terminating (the sandbox removes them with the node)."""
        kube = self.sandbox.kube
        original = kube.delete_node

        def delete_node(name: str) -> None:
            never_ready = {self.nodes.get(instance_id) for instance_id in self.never_ready}
            instance = next((i for i, node in self.nodes.items() if node == name), "")
            began, now = self.first_interrupted.get(instance, 0.0), time.monotonic()
            # A replica paused or dead while the node was interrupted may have held its message (a long poll
            # it had open takes it even while paused): another replica gets it only after its visibility
            # timeout, which may outlast the notice.
            disturbed = any(start <= now and end >= began - 1.0 for start, end in self.disturbances)
            if name not in self.deleted_on_purpose and name not in never_ready and not disturbed:
                left = [
                    pod
                    for pod in kube.objects("pods")
                    if (pod.get("spec") or {}).get("nodeName") == name
                    and not pod["metadata"].get("deletionTimestamp")
                    and not any(
                        r.get("kind") == "DaemonSet" for r in pod["metadata"].get("ownerReferences") or []
                    )
                    and "kubernetes.io/config.mirror" not in (pod["metadata"].get("annotations") or {})
                ]
                # A budget held now, or relaxed too recently for a blocked eviction's next retry (it backs off
                # to EVICTION_RETRY_S apart, or waits for its budget's gate, closed up to GATE_MOST_S): not a
                # drain its budgets allowed.
                retry_s = max(EVICTION_RETRY_S[1], GATE_MOST_S)
                # So is a pod whose own eviction its budget refused within that window: the drain honoured a
                # budget the workload's replacements had not let go yet (at SCALE a loaded machine's second is
                # 20 simulated ones, and a gate closes for real seconds). One refused long before is not.
                refused: dict[tuple[str, str], float] = getattr(kube, "budget_refused_at", dict)()
                honoured = any(
                    now - refused.get((pod["metadata"]["namespace"], pod["metadata"]["name"]), -1e18)
                    < retry_s
                    for pod in left
                )
                # With DELETE_AT_DEADLINE a notice's end is no excuse: what a budget holds is deleted before it.
                noticed = (
                    self.story.delete_at_deadline and abs(self.notice_ends.get(instance, -1e9) - now) < 1.0
                )
                if left and not noticed and (self.held or now - self.released_at < retry_s or honoured):
                    self.held_ever.add(name)
                elif left:
                    at = round((time.monotonic() - self.t0) / SCALE, 1)
                    self.gone_undrained[name] = f"t={at}s: " + ", ".join(p["metadata"]["name"] for p in left)
            if self.surge is not None:
                self.surge.node_gone()
            original(name)

        kube.delete_node = delete_node  # type: ignore[method-assign]

    def still_ours(self) -> dict[str, list[str]]:
        """Instances back in service (started again, or moved out of the warm pool, not interrupted since) whose
        node still carries something of ours (:func:`_ours_on`): instance ID → what."""
        found: dict[str, list[str]] = {}
        for instance_id, back_at in self.returned.items():
            if self.interrupted.get(instance_id, 0.0) > back_at:
                continue  # interrupted again since it came back
            lifecycle, ec2 = self._state(instance_id)
            node = self.sandbox.kube.get("nodes", self.nodes.get(instance_id, ""))
            if lifecycle != "InService" or ec2 != "running" or node is None:
                continue
            left = _ours_on(node)
            if left:
                found[instance_id] = left
        return found

    def settled(self) -> bool:
        """Nothing left to do: no action open, the queue empty, every instance back in service with its node
        given back (:meth:`still_ours`), every instance out of its wait states."""
        aws = self.sandbox.aws
        if time.monotonic() < self.quiet_after:  # a notice still to end: its state changes are to come
            return False
        if any(action.status == "open" for action in aws.actions()):
            return False
        counts = self.sandbox.queue_counts()
        if counts.visible or counts.in_flight:
            return False
        if self.still_ours():
            return False
        if self.surge is not None and not self.surge.settled(self.killed):
            return False
        return not any(
            ":Wait" in (aws.lifecycle_state(i.instance_id) or "")
            or ":Pending" in (aws.lifecycle_state(i.instance_id) or "")
            for i in aws.instances()
        )


def _ours_on(node: dict[str, Any]) -> list[str]:
    """What of ours a node still carries: the cordon, our taints, label and record."""
    metadata = node.get("metadata") or {}
    taints = [
        t["key"] for t in (node.get("spec") or {}).get("taints") or [] if t["key"].startswith(OUR_TAINTS)
    ]
    labels = metadata.get("labels") or {}
    left = taints + [key for key in (LB_LABEL, RECORD_LABEL) if key in labels]
    if RECORD_ANNOTATION in (metadata.get("annotations") or {}):
        left.append(RECORD_ANNOTATION)
    if (node.get("spec") or {}).get("unschedulable"):
        left.append("unschedulable")
    return left


def run(
    story: Storyline,
    *,
    kubernetes: Literal["emulated", "real"] = "emulated",
    plane: Any = None,
    rbac: Any = None,
    settings: dict[str, str] | None = None,
    settle_s: float = SETTLE_S,
    before_step: Callable[[Step, Sandbox], None] | None = None,
    keep: Path | None = None,
) -> Outcome:
    """Play ``story`` against a fresh sandbox and judge it. ``settings`` override the controllers' (environment
    variables; a test breaks one on purpose to show the judge catches it). ``plane`` and ``rbac``: the real
    control plane and the controller's RBAC rules, with ``kubernetes="real"``; ``settle_s``: how long (real
    seconds) everything may take to settle after the last step before it is judged as it stands;
    ``before_step``: called with each step and the sandbox just before the step is applied (a test waits there
    for the state a step is meant to meet, so that a loaded machine cannot reorder what it checks); ``keep``: a
    directory the controllers' logs and the sandbox's files are written to and left in (a temporary one
    otherwise, removed after)."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if keep is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"explore-{story.seed}-")))
        else:
            workdir = keep
            workdir.mkdir(parents=True, exist_ok=True)
        options = SandboxOptions(
            nodes=story.nodes,
            asgs=story.asgs,
            scale=SCALE,
            heartbeat_timeout_s=HOOK_TIMEOUT_S,
            launch_heartbeat_timeout_s=HOOK_TIMEOUT_S,
            visibility_timeout_s=10,
            max_receive_count=10,
            node_register_s=40,
            node_ready_s=20,
            cluster=ClusterSpec(apps=story.apps, pdb_max_unavailable=1, last_pods=story.last_pods),
        )
        with Sandbox(
            options, workdir=workdir / "sandbox", kubernetes=kubernetes, plane=plane, rbac=rbac
        ) as sandbox:
            sandbox.kube.ensure_namespace(sandbox.controller_namespace)
            world = _World(sandbox, story, workdir, settings, before_step)
            try:
                world.place_own_pod()
                world.place_surge()
                for replica in world.replicas:
                    world.start(replica)
                world.play()
                for (
                    replica
                ) in world.replicas:  # the storyline is over: a paused replica wakes, a dead one is back
                    if replica.paused and replica.process is not None:
                        replica.process.process.send_signal(signal.SIGCONT)
                        replica.paused = False
                    if replica.process is None:
                        world.start(replica)
                deadline = time.monotonic() + settle_s
                while not world.settled() and time.monotonic() < deadline:
                    world.keep_capacity()
                    world.follow_own_pod()
                    if world.surge is not None:
                        world.surge.tick()
                    time.sleep(0.1)
            finally:
                world.stop_all()
            violations(world)
            if keep is not None:
                _write_evictions(sandbox, keep / "evictions.jsonl")
            outcome = world.outcome
    outcome.seconds = round(time.monotonic() - started, 1)
    return outcome


def _write_evictions(sandbox: Sandbox, path: Path) -> None:
    """The evictions the API server took, in order, one JSON line each (namespace, name, uid, node, the drain
    annotation, the pod's labels and the drain that sent it): what ``last-early`` is judged on."""
    with path.open("w") as out:
        for pod in sandbox.kube.evictions:
            metadata = pod["metadata"]
            line = {
                "namespace": metadata["namespace"],
                "name": metadata["name"],
                "uid": metadata.get("uid"),
                "node": (pod.get("spec") or {}).get("nodeName"),
                "drain": (metadata.get("annotations") or {}).get("queue-processor/drain"),
                "labels": metadata.get("labels") or {},
                "drain_id": drain_of(pod),
            }
            out.write(json.dumps(line) + "\n")


def violations(world: _World) -> None:
    """Check every invariant (module docstring) on a played storyline; failures go to ``world.outcome``."""
    sandbox = world.sandbox
    nodes = sorted(set(world.nodes.values()))
    verdict = judge(sandbox, nodes, world.t0)
    for action in sandbox.aws.actions():
        launch = "LAUNCH" in action.transition
        expected = "ABANDON" if launch and action.instance_id in world.never_ready else "CONTINUE"
        if action.status in ("open", "timed-out"):
            world.fail("lifecycle", f"{action.instance_id} {action.hook_name}: {action.status}")
        elif action.status == "completed" and action.result != expected:
            world.fail(
                "lifecycle", f"{action.instance_id} {action.hook_name}: {action.result}, not {expected}"
            )
    if verdict["nodes_drained_twice"]:
        world.fail("drained-twice", f"{verdict['nodes_drained_twice']} node(s)")
    mirror = sum(
        1
        for pod in sandbox.kube.evictions
        if "kubernetes.io/config.mirror" in (pod["metadata"].get("annotations") or {})
    )
    if verdict["daemonset_pods_evicted"] or mirror:
        world.fail("daemonset-or-mirror", f"{verdict['daemonset_pods_evicted']} DaemonSet, {mirror} mirror")
    holds = any(step.kind == "pdb-hold" for step in world.story.steps)
    late = frozenset(
        tuple(pod.split("/", 1))
        for replica in world.replicas
        for process in [*replica.earlier, *([replica.process] if replica.process is not None else [])]
        for line in process.lines()
        if line.get("event") in (LOOKED_AGAIN, WAVE_TIME_UP)
        for pod in line.get("pods") or []
    )
    # An ordinary pod its budget refused went when the budget let it: after the last wave, when that wave
    # started because only its time was left (the spot storm's budgets refuse with no hold step). So may a pod
    # whose eviction was unanswered, or waiting at its budget's gate, when its wave's time was up.
    refused: dict[tuple[str, str], float] = getattr(sandbox.kube, "budget_refused_at", dict)()
    early = last_pods_evicted_early(sandbox.kube.evictions, late | frozenset(refused))
    if early and not world.story.faults and not holds:
        world.fail("last-early", f"{early} pod(s) annotated last")
    if verdict["heartbeats_after_end"]:
        world.fail("heartbeat-after-end", str(verdict["heartbeats_after_end"]))
    if verdict["messages_left"] or verdict["dlq"]:
        world.fail("messages", f"{verdict['messages_left']} left, {verdict['dlq']} in the dead-letter queue")
    for instance_id, left in world.still_ours().items():
        world.fail("returned", f"{instance_id}: {left}")
    if world.gone_undrained:
        world.fail("gone-undrained", json.dumps(world.gone_undrained))
    process_lines = [
        process.lines()
        for replica in world.replicas
        for process in [*replica.earlier, *([replica.process] if replica.process is not None else [])]
    ]
    undone = cordons_undone(process_lines)
    if undone:
        world.fail("cordon-undone", ", ".join(undone))
    if world.surge is not None:
        logs = [
            line
            for replica in world.replicas
            for process in [*replica.earlier, *([replica.process] if replica.process is not None else [])]
            for line in process.lines()
        ]
        for invariant, what in world.surge.verdicts(logs, world.killed).items():
            world.fail(invariant, what)
    for replica in world.replicas:
        processes = [*replica.earlier, *([replica.process] if replica.process is not None else [])]
        for process in processes:
            lines = process.lines()
            if any("Traceback" in json.dumps(line) for line in lines):
                world.fail("process", f"{replica.name}: a traceback")
            lost = sum(1 for line in lines if line.get("event") == LEASE_LOST)
            if lost and not replica.disturbed:
                world.fail("lease-lost", f"{replica.name} lost {lost} Lease(s), never paused or killed")
        if replica.process is not None and not replica.stopped_while_starting:
            stopped = [line for line in replica.process.lines() if line.get("event") == "stopped"]
            counts = (
                {key: stopped[-1].get(key) for key in ("tasks_left", "operations_left", "heartbeats_left")}
                if stopped
                else None
            )
            if counts != {"tasks_left": 0, "operations_left": 0, "heartbeats_left": 0}:
                world.fail("process", f"{replica.name}: stopped with {counts}")


def exit_verdict(code: int, lines: list[dict[str, Any]]) -> str | None:
    """How a controller stopped with SIGTERM ended: ``None`` for exit 0; ``"stopped-while-starting"`` for the
    signal's default action on a process that had not written a line (still importing, before its handler
    was installed: it held nothing); otherwise ``"exited <code>"`` (a failure), followed by the last line it
    wrote that is not a JSON log line (its own words on stderr: ``queue-processor: cannot start: …``), if any,
    so that a failure in CI says why."""
    if code == 0:
        return None
    if code == -signal.SIGTERM and not lines:
        return "stopped-while-starting"
    said = [str(line["event"]) for line in lines if line.get("raw") and str(line.get("event")).strip()]
    return f"exited {code}" + (f" ({said[-1]})" if said else "")


def shrink(story: Storyline, invariant: str, runner: Callable[[Storyline], Outcome] = run) -> Storyline:
    """The smallest subset of ``story``'s steps that still fails ``invariant`` (delta debugging, ddmin: drop
    chunks of steps while the rest still fails, halving the chunks until single steps). Each try is a run."""
    keep = list(range(len(story.steps)))
    chunks = 2
    while len(keep) >= 2:
        size = max(1, len(keep) // chunks)
        reduced = False
        for start in range(0, len(keep), size):
            rest = keep[:start] + keep[start + size :]
            if rest and invariant in runner(story.only(set(rest))).failed:
                keep, chunks, reduced = rest, max(chunks - 1, 2), True
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(keep), chunks * 2)
    return story.only(set(keep))


@contextmanager
def _real_plane(kubernetes: str) -> Iterator[Any]:
    if kubernetes != "real":
        yield None
        return
    from queue_processor_sandbox.control_plane import ControlPlane

    plane = ControlPlane()
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def main(argv: list[str] | None = None) -> int:
    """``make explore``: run storylines, one line each; 1 when one failed (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="explore", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--seeds", type=int, default=int(os.environ.get("SEEDS", "24")), help="storylines to run"
    )
    parser.add_argument(
        "--seed-from", type=int, default=int(os.environ.get("SEED_FROM", "0")), help="first seed"
    )
    parser.add_argument("--seed", type=int, default=None, help="replay this one seed")
    parser.add_argument("--kubernetes", choices=("emulated", "real"), default="emulated")
    parser.add_argument("--no-shrink", action="store_true", help="report a failure without shrinking it")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="write each storyline's controller logs and sandbox files to DIR/seed-<seed> and keep them",
    )
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.seed_from, args.seed_from + args.seeds))
    failed = 0
    with _real_plane(args.kubernetes) as plane:
        for seed in seeds:
            story = generate(seed)
            try:
                keep = args.keep / f"seed-{seed}" if args.keep is not None else None
                outcome = run(story, kubernetes=args.kubernetes, plane=plane, keep=keep)
            except (
                Exception
            ) as error:  # the bench itself failed (a sandbox that did not start): say so, go on
                outcome = Outcome(story, failed={"explorer": f"{type(error).__name__}: {error}"})
            verdict = "ok" if outcome.ok else "FAIL"
            line = (
                f"seed {seed}: {verdict} ({story.describe()}, {len(outcome.applied)} applied, "
                f"{len(outcome.skipped)} skipped; {outcome.seconds} s)"
            )
            print(line, flush=True)
            if outcome.ok:
                continue
            failed += 1
            for invariant, what in outcome.failed.items():
                print(f"  {invariant}: {what}", flush=True)
            if not args.no_shrink:
                invariant = next(iter(outcome.failed))
                small = shrink(story, invariant, lambda s: run(s, kubernetes=args.kubernetes, plane=plane))
                print(f"  shrunk to {len(small.steps)} step(s) that still fail {invariant}:", flush=True)
                for step in small.steps:
                    print(f"    {step.describe()}", flush=True)
            replay = f"make explore SEED={seed}" + (" KUBERNETES=real" if args.kubernetes == "real" else "")
            print(f"  replay: {replay}", flush=True)
    print(f"{len(seeds) - failed} of {len(seeds)} storylines held", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
