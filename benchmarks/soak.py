"""A soak: ``--minutes`` of sandbox time (default 30) of mixed traffic with faults injected at random on both
sides, the controller running as its own process; its memory at the start and at the end, and what it holds.

Time is the sandbox's scaled clock: at ``--scale 0.05`` (the default) 30 simulated minutes last 90 real
seconds, a Spot notice 6 s. Cluster: ``--nodes`` nodes in Auto Scaling groups with terminate and launch
lifecycle hooks, 10 pods per node from 10 ReplicaSets with PodDisruptionBudgets (maxUnavailable ``--pdb``), a
DaemonSet, mirror, emptyDir and unreplicated pods, and a ``slow`` ReplicaSet (one pod per four nodes) whose
pods take one HeartbeatTimeout to terminate, so that drains of nodes leaving through a terminate hook outlive
a heartbeat interval and heartbeats (and their faults) happen.

Traffic, at ``--rate`` incidents per simulated minute, each on an idle InService instance (the first five are
one of each kind, then drawn at random, seeded):

- ``spot``: a Spot interruption warning, a third of them after a rebalance recommendation; the sandbox
  terminates the instance when the 120 s notice ends (state changes ``shutting-down``, ``terminated``);
- ``asg-terminate``: a scale-in through the terminate hook (the controller drains, then completes the action);
- ``rebalance``: a rebalance recommendation, then 60-180 s later Capacity Rebalancing scales the instance in
  through the terminate hook;
- ``state-change``: the instance is stopped (``stopping``, ``stopped``), terminated 60-120 s later;
- ``scheduled-change``: an AWS Health scheduled change naming one or two instances, retired (terminated)
  when it starts, 120-300 s later;
- replacements: whenever fewer than ``--nodes`` instances are not leaving, new ones launch into the groups
  (their launch actions are completed by the controller once their nodes are Ready), so capacity never runs
  out;
- duplicates: each message the sandbox publishes is sent again, as it is, with probability ``--duplicates``,
  0-30 s later (EventBridge and SQS deliver at least once);
- poison: one of the sandbox's poison bodies every ``--poison-every`` simulated seconds; each must end in the
  dead-letter queue.

Faults, seeded, at random times:

- Kubernetes (the emulated API server), about one every ``--kube-fault-every`` simulated seconds: 500s, 429s
  with ``Retry-After: 1``, slow answers (0.5-2 real seconds) and connection resets, for the next 1-3 requests
  that list pods, evict a pod, patch or get a node;
- AWS, about one every ``--aws-fault-every`` simulated seconds: ``Throttling`` of the next
  RecordLifecycleActionHeartbeat call or of the next 1-2 CompleteLifecycleAction calls, or the AWS endpoint
  unreachable for 0.5 to ``--outage-max-s`` (1.5) real seconds (the sandbox's ``stop_endpoint`` and
  ``restart_endpoint``: SQS, Auto Scaling and EC2 all refuse connections meanwhile). Heartbeat throttling and
  outages take turns, as do completion throttles: the next of a kind only once the previous one has been met
  and at least 3.5 real seconds plus the longest outage later, so that no action loses two heartbeats in a row
  to them (the controller retries a failed beat 2 s later; two failures in a row would be over a scaled
  HeartbeatTimeout).

The controller's own waits are real seconds; those that stand for a duration of the cluster are scaled:
``REQUEUE_BACKOFF_BASE_SEC`` (10 s), ``RECEIVE_WAIT_TIME_SEC`` (20 s), ``SQS_MSG_VISIBILITY_TIMEOUT_SEC`` (60 s,
at least 10), ``NODE_TERMINATION_GRACE_PERIOD`` (two HeartbeatTimeouts); ``POISON_VISIBILITY_TIMEOUT_SEC`` is
2 s (as ``queue-processor sandbox``). The hooks' HeartbeatTimeout is 300 simulated seconds, or more when that
would be under 15 real seconds: the controller retries a failed heartbeat after 2 and 10 real seconds, which
must fit in it.

Measured in the same run:

- ``rss_start_mib``: the controller's resident memory (VmRSS) after ``--warmup-minutes`` (default 3) of
  simulated time, by when each kind of incident and fault has been published or injected once and poison
  sent (a heartbeat throttle is met at the next heartbeat); ``rss_end_mib`` once the traffic has stopped and
  everything has settled (queue and in-flight operations empty, no action open); ``rss_growth_pct`` between
  the two; ``peak_rss_mib`` (VmHWM);
- ``fds_start``/``fds_end``: open file descriptors (``/proc/<pid>/fd``) at the same two moments;
- ``in_flight_end``: the ``queue_processor_in_flight_operations`` gauge at the end (per-node operation
  tasks alive). The controller exposes no live count of its asyncio tasks; ``tasks_end`` is the count its
  ``stopped`` log line gives after the SIGTERM that ends the run (tasks of its loop still alive), with
  ``operations_left`` and ``heartbeats_left`` from the same line;
- the judge's fields (:func:`queue_processor_sandbox.run.judge`) over every node an incident targeted;
- ``nodes_gone_undrained`` / ``pods_gone_unevicted``: nodes that went (instance terminated) with pods on them
  that a drain would have evicted and that were not even terminating; a Spot drain slowed by faults may lose
  that race with its notice. Informative, not part of the goal. (The emulation's ReplicaSets do not replace
  pods removed with their node; the soak has them replaced, see ``Soak._wrap_delete_node``.)
- ``faults_injected`` (injections by kind) and ``faults_met`` (requests or calls that got the fault; an
  injection still pending when the traffic stops is withdrawn), ``messages_published`` (deliveries to the
  queue, duplicates and poison included), the controller log's warnings, errors and tracebacks.

Goal: ``goal_met`` = RSS growth < 10 % and nothing lost: lifecycle_timed_out 0, messages_left 0, dlq equal to
the poison sent, nodes_drained_twice 0, daemonset_pods_evicted 0.

Kubernetes faults need the emulation (a real control plane has no fault injection); ``--kubernetes real`` is
refused rather than run with half the faults. The run is seeded, but the interleaving of the controller,
the sandbox and the traffic is not: two runs with one seed publish about the same traffic, not the same.

Last line: one JSON object with those figures.

Usage: ``python benchmarks/soak.py [--minutes 30] [--scale 0.05] [--nodes 50] [--rate 10] [--seed 1]
[--log controller.log]``
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from random import Random
from typing import Any, Literal

from queue_processor_sandbox.aws import QueueCounts
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import POISON_BODIES, Sandbox, SandboxOptions
from queue_processor_sandbox.kube import KubeSandbox
from queue_processor_sandbox.kube.routes import Fault
from queue_processor_sandbox.processes import Samples, proc_status, scrape, total
from queue_processor_sandbox.run import judge

#: Incident kinds and their weights once the first of each has been published.
INCIDENTS = {"spot": 3, "asg-terminate": 3, "rebalance": 1, "state-change": 1, "scheduled-change": 1}
#: Kubernetes faults: (verb, resource) x how the request fails; weights of the requests.
KUBE_TARGETS = {
    ("list", "pods"): 3,
    ("create", "pods/eviction"): 4,
    ("patch", "nodes"): 2,
    ("get", "nodes"): 1,
}
KUBE_HOW = ("500", "429", "slow", "reset")
#: AWS faults and their weights.
AWS_FAULTS = {"heartbeat-throttling": 4, "completion-throttling": 3, "outage": 1}
#: The shortest gap (real seconds) between two AWS faults of one lane, beyond the longest outage: longer than
#: the controller's first retry of a failed heartbeat (2 s), so no action loses two beats in a row to them.
MIN_AWS_GAP_REAL_S = 3.5
#: The judge's fields the last line carries.
JUDGED = (
    "drained",
    "cordoned",
    "evicted",
    "lifecycle_completed",
    "lifecycle_timed_out",
    "daemonset_pods_evicted",
    "messages_left",
    "dlq",
    "heartbeats_after_end",
    "nodes_drained_twice",
    "evictions_repeated",
    "evictions_denied",
)
#: The shortest HeartbeatTimeout (real seconds) the hooks get: the controller's retries of a failed
#: heartbeat (2 s, then 10 s) must fit in it.
MIN_HOOK_TIMEOUT_REAL_S = 15.0


# ------------------------------------------------------------------------------------------------ the process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until the controller answers /readyz (it has received from SQS and reached the API server)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"controller exited with {process.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("controller not ready in time")


def _metrics(port: int) -> Samples:
    """The controller's /metrics as samples by name; empty when it does not answer."""
    try:
        return scrape(port)
    except OSError:
        return {}


def _memory(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (KiB) and Threads of a process, from /proc/<pid>/status."""
    status = proc_status(pid)
    return {key: status[key] for key in ("VmRSS", "VmHWM", "Threads") if key in status}


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _log_summary(path: Path) -> dict[str, Any]:
    """Counts of the controller log's lines by level, its tracebacks, its most frequent warnings and errors,
    and its last ``stopped`` line."""
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    tracebacks = 0
    stopped: dict[str, Any] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = {"level": "raw", "event": line[:120]}
        if not isinstance(record, dict):
            continue
        level = str(record.get("level", "?"))
        levels[level] += 1
        tracebacks += "Traceback" in line
        if level in ("warning", "error", "critical", "raw"):
            events[f"{level}: {record.get('event')}"] += 1
        if record.get("event") == "stopped":
            stopped = record
    return {
        "levels": dict(levels),
        "tracebacks": tracebacks,
        "top": events.most_common(8),
        "stopped": stopped,
    }


# ------------------------------------------------------------------------------------------------ the traffic


class Soak:
    """The traffic and the faults, driven from one thread by :meth:`tick` (every sandbox call is made from
    it; the sandbox's own timers end notices and hook timeouts)."""

    def __init__(self, sandbox: Sandbox, kube: KubeSandbox, args: argparse.Namespace) -> None:
        self.sandbox = sandbox
        self.kube = kube
        self.args = args
        self.scale = args.scale
        self.rng = Random(args.seed)
        assert sandbox.queue is not None
        self.queue_url = sandbox.queue.url
        self.t0 = time.monotonic()
        self._later: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.busy: dict[str, str] = {}  # instance ID → incident kind, until the instance is gone
        self.targets: dict[str, str] = {}  # instance ID → node name, every instance an incident chose
        self.incidents: Counter[str] = Counter()
        self.launched = 0
        self.skipped = 0  # incidents with no idle instance to act on
        self.poison = 0
        self.duplicates = 0
        self.errors: Counter[str] = Counter()  # the traffic's own calls that failed (an outage, a race)
        self.kube_faults: list[tuple[str, Fault, int]] = []
        self.injected: Counter[str] = Counter()
        # per lane: (operation, Throttling answers expected once met); when the lane's last fault began
        self.aws_pending: dict[str, tuple[str, int]] = {}
        self.aws_last = {"heartbeat": -math.inf, "completion": -math.inf}
        self.outage_until: float | None = None  # (monotonic) while the AWS endpoint is down
        self._outage_planned: list[float] = []
        self.outage_seconds: list[float] = []  # how long each outage really lasted
        self._published_seen = 0
        self._kinds = iter(INCIDENTS)  # the first of each kind, in order
        self._kube_first = iter(
            zip(["list pods", "eviction", "patch nodes", "eviction"], KUBE_HOW, strict=True)
        )
        self._aws_first = ["completion-throttling", "outage", "heartbeat-throttling"]
        self.next_incident = 1.0
        self.next_kube_fault = 2.0
        self.next_aws_fault = 3.0
        self.next_poison = 5.0
        self.undrained: dict[str, int] = {}
        self._wrap_delete_node()

    # --------------------------------------------------------------------------------------------- clock

    def sim(self) -> float:
        """Simulated seconds since the traffic started."""
        return (time.monotonic() - self.t0) / self.scale

    def later(self, sim_s: float, what: str, action: Callable[[], None]) -> None:
        """Run ``action`` ``sim_s`` simulated seconds from now (from :meth:`run_due`)."""
        due = time.monotonic() + sim_s * self.scale
        heapq.heappush(self._later, (due, next(self._seq), what, action))

    def run_due(self) -> None:
        now = time.monotonic()
        while self._later and self._later[0][0] <= now:
            _, _, what, action = heapq.heappop(self._later)
            self._guarded(what, action)

    @property
    def pending(self) -> int:
        return len(self._later)

    def _guarded(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as error:  # an instance already gone, the endpoint down: counted, never fatal
            self.errors[f"{what}: {type(error).__name__}"] += 1

    # ------------------------------------------------------------------------------------------ instances

    def _wrap_delete_node(self) -> None:
        """Count, when a node goes with its instance, the pods on it a drain would have evicted and that were
        not even terminating (the sandbox removes them with the node; their ReplicaSets replace them)."""
        kube, original = self.kube, self.kube.delete_node

        def delete_node(name: str) -> None:
            with kube.lock:  # the pods seen are the pods removed
                left = [
                    pod
                    for pod in kube.pods_on(name)
                    if not pod["metadata"].get("deletionTimestamp")
                    and not any(
                        r.get("kind") == "DaemonSet" for r in pod["metadata"].get("ownerReferences") or []
                    )
                    and "kubernetes.io/config.mirror" not in (pod["metadata"].get("annotations") or {})
                ]
                if left:
                    self.undrained[name] = len(left)
                original(name)

        kube.delete_node = delete_node  # type: ignore[method-assign]

    def _states(self) -> dict[str, tuple[str, str, str]]:
        """Instance ID → (lifecycle state, group, node name) of every instance in a group."""
        aws = self.sandbox.aws
        return {
            i.instance_id: (aws.lifecycle_state(i.instance_id) or "", i.asg_name or "", i.private_dns_name)
            for i in aws.instances()
        }

    def housekeeping(self) -> None:
        """Forget leaving instances that are gone; launch replacements while fewer than ``--nodes`` instances
        are staying."""
        states = self._states()
        for instance_id in [i for i in self.busy if i not in states]:
            del self.busy[instance_id]
        staying = [(group, iid) for iid, (_, group, _) in states.items() if iid not in self.busy]
        missing = self.args.nodes - len(staying)
        if missing <= 0 or self.outage_until is not None:
            return
        groups = Counter({f"workers-{index}": 0 for index in range(self.args.asgs)})
        groups.update(group for group, _ in staying)
        for _ in range(missing):
            group = min(groups, key=lambda name: groups[name])
            self.sandbox.aws.launch_instances(group, 1)
            groups[group] += 1
            self.launched += 1

    def _idle(self, count: int) -> list[str]:
        states = self._states()
        idle = sorted(i for i, (state, _, _) in states.items() if state == "InService" and i not in self.busy)
        chosen = self.rng.sample(idle, min(count, len(idle)))
        for instance_id in chosen:
            self.targets[instance_id] = states[instance_id][2]
        return chosen

    # ------------------------------------------------------------------------------------------ incidents

    def incident(self) -> None:
        kind = next(self._kinds, None) or self.rng.choices(list(INCIDENTS), list(INCIDENTS.values()))[0]
        chosen = self._idle(self.rng.choice((1, 2)) if kind == "scheduled-change" else 1)
        if not chosen:
            self.skipped += 1
            return
        for instance_id in chosen:
            self.busy[instance_id] = kind
        self.incidents[kind] += 1
        aws = self.sandbox.aws
        instance_id = chosen[0]
        if kind == "spot":
            if self.rng.random() < 1 / 3:
                aws.rebalance_recommendation(instance_id)
            aws.spot_interruption(instance_id)
        elif kind == "asg-terminate":
            aws.terminate_instance(instance_id)
        elif kind == "rebalance":
            aws.rebalance_recommendation(instance_id)
            self.later(self.rng.uniform(60, 180), "capacity rebalancing", lambda: self._scale_in(instance_id))
        elif kind == "state-change":
            aws.stop_instance(instance_id)
            self.later(
                self.rng.uniform(60, 120), "terminate", lambda: aws.terminate_ec2_instance(instance_id)
            )
        else:
            start_in = self.rng.uniform(120, 300)
            aws.scheduled_change(chosen, start_in_s=start_in, duration_s=600)
            for each in chosen:
                self.later(start_in, "retire", lambda each=each: aws.terminate_ec2_instance(each))

    def _scale_in(self, instance_id: str) -> None:
        """Capacity Rebalancing replaces the instance: a scale-in through the terminate hook."""
        if self.sandbox.aws.lifecycle_state(instance_id) == "InService":
            self.sandbox.aws.terminate_instance(instance_id)
        else:  # not expected: free it anyway
            self.sandbox.aws.terminate_ec2_instance(instance_id)

    def send_poison(self) -> None:
        self.sandbox.aws.send_raw(self.queue_url, POISON_BODIES[self.poison % len(POISON_BODIES)])
        self.poison += 1

    def duplicate_new_messages(self) -> None:
        """Send again, later, some of what the sandbox published since the last call."""
        published = self.sandbox.aws.published()
        for message in published[self._published_seen :]:
            if message.via != "raw" and self.rng.random() < self.args.duplicates:
                self.duplicates += 1
                body = message.body
                self.later(
                    self.rng.uniform(0, 30),
                    "duplicate",
                    lambda body=body: self.sandbox.aws.send_raw(self.queue_url, body),
                )
        self._published_seen = len(published)

    def messages_published(self) -> int:
        return sum(len(message.queues) for message in self.sandbox.aws.published())

    # --------------------------------------------------------------------------------------------- faults

    def kube_fault(self) -> None:
        first = next(self._kube_first, None)
        if first is not None:
            target = {"list pods": ("list", "pods"), "eviction": ("create", "pods/eviction")}.get(
                first[0], ("patch", "nodes")
            )
            how = first[1]
        else:
            target = self.rng.choices(list(KUBE_TARGETS), list(KUBE_TARGETS.values()))[0]
            how = self.rng.choice(KUBE_HOW)
        verb, resource = target
        count = self.rng.randint(1, 3)
        if how == "500":
            fault = self.kube.inject_fault(verb, resource, status=500, count=count)
        elif how == "429":
            fault = self.kube.inject_fault(verb, resource, status=429, retry_after_s=1, count=count)
        elif how == "slow":
            fault = self.kube.inject_fault(
                verb, resource, delay_s=round(self.rng.uniform(0.5, 2.0), 2), count=count
            )
        else:
            fault = self.kube.inject_fault(verb, resource, reset=True, count=count)
        self.kube_faults.append((f"kube_{how}", fault, count))
        self.injected[f"kube_{how}"] += 1

    def _throttled(self) -> Counter[str]:
        return Counter(
            call.operation for call in self.sandbox.aws.calls() if call.outcome.startswith("Throttling")
        )

    def _lane(self, kind: str) -> str:
        """Heartbeat throttling and outages both fail heartbeats: they share a lane; completions have one."""
        return "completion" if kind == "completion-throttling" else "heartbeat"

    def _lane_ready(self, lane: str) -> bool:
        """Whether the lane's previous fault has been met (or its outage is over) and it was injected at least
        :data:`MIN_AWS_GAP_REAL_S` plus the longest outage ago."""
        if time.monotonic() - self.aws_last[lane] < MIN_AWS_GAP_REAL_S + self.args.outage_max_s:
            return False
        if lane == "heartbeat" and self.outage_until is not None:
            return False
        pending = self.aws_pending.get(lane)
        if pending is not None:
            operation, expected = pending
            if self._throttled()[operation] < expected:
                return False
            del self.aws_pending[lane]
        return True

    def aws_fault(self) -> bool:
        """Inject an AWS fault whose lane is ready; whether one was."""
        ready = [kind for kind in AWS_FAULTS if self._lane_ready(self._lane(kind))]
        if not ready:
            return False
        first = [kind for kind in self._aws_first if kind in ready]
        if first:
            kind = first[0]
            self._aws_first.remove(kind)
        else:
            kind = self.rng.choices(ready, [AWS_FAULTS[k] for k in ready])[0]
        aws = self.sandbox.aws
        if kind == "outage":
            duration = self.rng.uniform(min(0.5, self.args.outage_max_s), self.args.outage_max_s)
            self._outage_planned.append(duration)
            aws.stop_endpoint()
            self.outage_until = time.monotonic() + duration
            timer = threading.Timer(duration, self._end_outage)  # on time, whatever the main loop is doing
            timer.daemon = True
            timer.start()
        else:
            operation: Literal["RecordLifecycleActionHeartbeat", "CompleteLifecycleAction"] = (
                "RecordLifecycleActionHeartbeat"
                if kind == "heartbeat-throttling"
                else "CompleteLifecycleAction"
            )
            times = 1 if kind == "heartbeat-throttling" else self.rng.randint(1, 2)
            aws.inject_error(operation, "Throttling", "Rate exceeded", times=times)
            self.aws_pending[self._lane(kind)] = (operation, self._throttled()[operation] + times)
        self.injected[f"aws_{kind}"] += 1
        self.aws_last[self._lane(kind)] = time.monotonic()
        return True

    def _end_outage(self) -> None:
        """Serve again (retried: the port may still be held for a moment); the outage's real length counted."""
        for attempt in range(20):
            try:
                self.sandbox.aws.restart_endpoint()
                break
            except OSError:
                time.sleep(0.1 * (attempt + 1))
        else:
            self.errors["the AWS endpoint could not be restarted after an outage"] += 1
            return
        assert self.outage_until is not None
        self.outage_seconds.append(time.monotonic() - self.outage_until + self._outage_planned[-1])
        self.aws_last["heartbeat"] = time.monotonic()
        self.outage_until = None

    def wait_outage(self, timeout_s: float = 30.0) -> None:
        """Until no outage is under way."""
        deadline = time.monotonic() + timeout_s
        while self.outage_until is not None and time.monotonic() < deadline:
            time.sleep(0.05)

    def withdraw_faults(self) -> None:
        """The traffic is over: withdraw every fault not met yet."""
        with self.kube.lock:
            for _, fault, _ in self.kube_faults:
                fault.count = 0
        self.sandbox.aws.clear_errors()

    def faults_met(self) -> dict[str, int]:
        met: Counter[str] = Counter()
        for kind, fault, count in self.kube_faults:
            met[kind] += count - fault.count
        throttled = self._throttled()
        met["aws_heartbeat-throttling"] = throttled["RecordLifecycleActionHeartbeat"]
        met["aws_completion-throttling"] = throttled["CompleteLifecycleAction"]
        met["aws_outage"] = self.injected["aws_outage"]
        return {kind: met[kind] for kind in sorted(met) if kind in self.injected or met[kind]}

    # ----------------------------------------------------------------------------------------------- tick

    def tick(self, traffic: bool) -> None:
        """One pass: follow-ups due, then (while ``traffic``) incidents, faults, poison and duplicates due."""
        self.run_due()
        if not traffic:
            return
        sim = self.sim()
        gap = 60.0 / self.args.rate
        while self.next_incident <= sim:
            self._guarded("incident", self.incident)
            self.next_incident += gap * self.rng.uniform(0.5, 1.5)
        while self.next_kube_fault <= sim:
            self.kube_fault()
            self.next_kube_fault += self.rng.expovariate(1.0 / self.args.kube_fault_every)
        if self.next_aws_fault <= sim and self.aws_fault():
            self.next_aws_fault = sim + self.rng.expovariate(1.0 / self.args.aws_fault_every)
        while self.next_poison <= sim:
            self._guarded("poison", self.send_poison)
            self.next_poison += self.args.poison_every
        self.duplicate_new_messages()


def _queue_counts(sandbox: Sandbox, soak: Soak) -> QueueCounts | None:
    """(visible, in flight, dead-letter) messages; ``None`` while the endpoint is down."""
    if soak.outage_until is not None:
        return None
    try:
        return sandbox.queue_counts()
    except Exception:
        return None


# ------------------------------------------------------------------------------------------------------ main


def main() -> None:
    """Run the soak and print its figures; the last line is the JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="simulated minutes of traffic (default 30)")
    ap.add_argument(
        "--scale", type=float, default=0.05, help="real seconds per simulated second (default 0.05)"
    )
    ap.add_argument(
        "--nodes", type=int, default=50, help="instances kept staying in the cluster (default 50)"
    )
    ap.add_argument("--rate", type=float, default=10.0, help="incidents per simulated minute (default 10)")
    ap.add_argument("--seed", type=int, default=1, help="seed of every random choice (default 1)")
    ap.add_argument("--pdb", default="25%", help="maxUnavailable of every PodDisruptionBudget (default 25%%)")
    ap.add_argument(
        "--duplicates", type=float, default=0.2, help="share of messages sent twice (default 0.2)"
    )
    ap.add_argument(
        "--poison-every", type=float, default=120.0, help="simulated s between poison (default 120)"
    )
    ap.add_argument(
        "--kube-fault-every", type=float, default=20.0, help="mean simulated s between Kubernetes faults (20)"
    )
    ap.add_argument(
        "--aws-fault-every", type=float, default=60.0, help="mean simulated s between AWS faults (60)"
    )
    ap.add_argument(
        "--outage-max-s", type=float, default=1.5, help="longest AWS outage, real seconds (default 1.5)"
    )
    ap.add_argument(
        "--warmup-minutes", type=float, default=3.0, help="simulated minutes before rss_start (3)"
    )
    ap.add_argument("--progress", type=float, default=10.0, help="real seconds between progress lines (10)")
    ap.add_argument(
        "--log", type=Path, default=None, help="keep the controller's log (info level, JSON) here"
    )
    ap.add_argument(
        "--kubernetes",
        choices=["emulated", "real"],
        default="emulated",
        help="only the emulation: a real control plane has no fault injection",
    )
    args = ap.parse_args()
    if args.kubernetes == "real":
        raise SystemExit(
            "soak: --kubernetes real is refused: half of the faults are the emulated API server's "
            "(inject_fault); a real control plane has none. Run benchmarks/storm.py --kubernetes real."
        )
    if args.warmup_minutes >= args.minutes:
        raise SystemExit("soak: --warmup-minutes must be shorter than --minutes")
    args.asgs = max(1, min(4, args.nodes // 20))
    real = args.scale  # real seconds per simulated second
    hook_timeout_s = float(max(300, math.ceil(MIN_HOOK_TIMEOUT_REAL_S / real)))
    options = SandboxOptions(
        nodes=args.nodes,
        asgs=args.asgs,
        scale=args.scale,
        heartbeat_timeout_s=int(hook_timeout_s),
        cluster=ClusterSpec(apps=10, pdb_max_unavailable=args.pdb),
    )
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir, Sandbox(options, workdir=Path(workdir)) as sandbox:
        kube = sandbox.kube
        assert isinstance(kube, KubeSandbox)
        names = [instance.private_dns_name for instance in sandbox.instances]
        namespace = sandbox.cluster.namespace
        kube.add_replicaset(
            namespace,
            "slow",
            nodes=names,
            replicas=max(1, args.nodes // 4),
            labels={"app": "slow"},
            grace_s=int(hook_timeout_s),
        )
        kube.add_pdb(namespace, "slow", match_labels={"app": "slow"}, max_unavailable=args.pdb)
        print(
            f"sandbox: {len(names)} nodes in {args.asgs} groups, {len(kube.objects('pods'))} pods, hooks' "
            f"HeartbeatTimeout {hook_timeout_s:.0f} s ({sandbox.clock.real(hook_timeout_s):.1f} s real); "
            f"{args.minutes:g} min at scale {args.scale:g} = {args.minutes * 60 * real:.0f} s real"
        )
        port = _free_port()
        env = {
            **os.environ,
            **sandbox.env(),
            "ENABLE_PROMETHEUS_SERVER": "true",
            "PROMETHEUS_SERVER_PORT": str(port),
            "PROBES_SERVER_PORT": str(port),
            "JSON_LOGGING": "true",
            "LOG_LEVEL": "info",
            "POISON_VISIBILITY_TIMEOUT_SEC": "2",
            "REQUEUE_BACKOFF_BASE_SEC": str(round(max(0.1, 10 * real), 3)),
            "RECEIVE_WAIT_TIME_SEC": str(min(max(1, round(20 * real)), 20)),
            "SQS_MSG_VISIBILITY_TIMEOUT_SEC": str(max(10, round(60 * real))),
            "NODE_TERMINATION_GRACE_PERIOD": str(max(1, math.ceil(2 * hook_timeout_s * real))),
        }
        log_path = Path(workdir) / "controller.log"
        log = log_path.open("w")
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "queue_processor.cli", "run"], env=env, stdout=log, stderr=log
        )
        pid = process.pid
        figures: dict[str, Any] = {}
        try:
            _wait_ready(port, process)
            soak = Soak(sandbox, kube, args)
            end_s, warmup_s = args.minutes * 60.0, args.warmup_minutes * 60.0
            rss_start = fds_start = 0
            next_progress = time.monotonic() + args.progress
            next_house = next_check = 0.0
            settle_deadline: float | None = None
            quiet_since: float | None = None
            stalls: list[float] = []
            last_tick = time.monotonic()
            while True:
                if time.monotonic() - last_tick > 1.0:  # the traffic fell behind (a slow sandbox call)
                    stalls.append(round(time.monotonic() - last_tick, 1))
                last_tick = time.monotonic()
                sim = soak.sim()
                traffic = sim < end_s
                soak.tick(traffic)
                now = time.monotonic()
                if now >= next_house:
                    soak._guarded("housekeeping", soak.housekeeping)
                    next_house = now + 0.5
                if not rss_start and sim >= warmup_s:
                    rss_start, fds_start = _memory(pid).get("VmRSS", 0), _fds(pid)
                    print(f"warm-up over at {sim:.0f} s: rss {rss_start / 1024:.1f} MiB, {fds_start} fds")
                if process.poll() is not None:
                    raise SystemExit(f"the controller exited with {process.returncode} during the soak")
                if now >= next_progress:
                    next_progress = now + args.progress
                    _progress(soak, sandbox, port, pid, sim)
                if not traffic and settle_deadline is None:
                    soak.withdraw_faults()
                    settle_deadline = now + 60.0 + 600 * real
                    print(f"traffic over at {sim:.0f} s: {soak.messages_published()} messages; settling")
                if settle_deadline is not None and now >= next_check:
                    next_check = now + 0.5
                    counts = _queue_counts(sandbox, soak)
                    busy = total(_metrics(port), "queue_processor_in_flight_operations")
                    settled = (
                        counts is not None
                        and counts[:2] == (0, 0)
                        and not busy
                        and not soak.pending
                        and not soak.busy
                        and soak.outage_until is None
                        and not sandbox.aws.actions(status="open")
                    )
                    quiet_since = (quiet_since or now) if settled else None
                    if quiet_since is not None and now - quiet_since >= 2.0:
                        break
                    if now >= settle_deadline:
                        print("settle deadline reached: measuring as it stands")
                        break
                time.sleep(0.05)
            soak.wait_outage()
            memory = _memory(pid)
            fds_end = _fds(pid)
            metrics = _metrics(port)
            verdict = judge(sandbox, sorted(soak.targets.values()), started)
            rss_end = memory.get("VmRSS", 0)
            figures = {key: verdict[key] for key in JUDGED}
            for line in _diagnose(sandbox, kube, log_path):
                print(line)
            figures.update(
                {
                    "rss_start_mib": round(rss_start / 1024, 1),
                    "rss_end_mib": round(rss_end / 1024, 1),
                    "rss_growth_pct": round(100.0 * (rss_end - rss_start) / rss_start, 1)
                    if rss_start
                    else None,
                    "peak_rss_mib": round(memory.get("VmHWM", 0) / 1024, 1),
                    "fds_start": fds_start,
                    "fds_end": fds_end,
                    "threads_end": memory.get("Threads"),
                    "in_flight_end": int(total(metrics, "queue_processor_in_flight_operations")),
                    "in_flight_messages_end": int(total(metrics, "queue_processor_in_flight_messages")),
                    "faults_injected": dict(sorted(soak.injected.items())),
                    "faults_met": soak.faults_met(),
                    "messages_published": soak.messages_published(),
                    "messages_received": int(total(metrics, "queue_processor_messages_received_total")),
                    "poison": soak.poison,
                    "duplicates": soak.duplicates,
                    "incidents": dict(sorted(soak.incidents.items())),
                    "incidents_skipped": soak.skipped,
                    "launched": soak.launched,
                    "nodes_targeted": len(soak.targets),
                    "nodes_gone_undrained": len(soak.undrained),
                    "pods_gone_unevicted": sum(soak.undrained.values()),
                    "traffic_errors": dict(soak.errors),
                    "traffic_stalls_s": stalls,
                    "outages_s": [round(seconds, 1) for seconds in soak.outage_seconds],
                    "timer_errors": len(sandbox.aws.timer_errors),
                }
            )
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            log.close()
            if args.log:
                args.log.write_text(log_path.read_text())
        summary = _log_summary(log_path)
    stopped = summary["stopped"]
    figures["tasks_end"] = stopped.get("tasks_left")
    figures["operations_left"] = stopped.get("operations_left")
    figures["heartbeats_left"] = stopped.get("heartbeats_left")
    figures["exit_code"] = process.returncode
    levels = summary["levels"]
    figures["log_warnings"] = levels.get("warning", 0)
    figures["log_errors"] = levels.get("error", 0) + levels.get("critical", 0)
    figures["tracebacks"] = summary["tracebacks"]
    print(f"controller log: {sum(levels.values())} lines {levels}, {summary['tracebacks']} tracebacks")
    for event, count in summary["top"]:
        print(f"  {count:6d}  {event}")
    print(f"stopped: {json.dumps({k: v for k, v in stopped.items() if k != 'timestamp'})}")
    figures["minutes"] = args.minutes
    figures["scale"] = args.scale
    figures["nodes"] = args.nodes
    figures["seed"] = args.seed
    figures["seconds_real"] = round(time.perf_counter() - wall, 1)
    growth = figures["rss_growth_pct"]
    figures["goal_met"] = bool(
        growth is not None
        and growth < 10.0
        and figures["lifecycle_timed_out"] == 0
        and figures["messages_left"] == 0
        and figures["dlq"] == figures["poison"]
        and figures["nodes_drained_twice"] == 0
        and figures["daemonset_pods_evicted"] == 0
    )
    print(json.dumps(figures))


def _diagnose(sandbox: Sandbox, kube: KubeSandbox, log_path: Path, most: int = 5) -> list[str]:
    """Lines on what the judge counts against a run: pods evicted twice (with the controller's log lines about
    their node), lifecycle actions timed out and heartbeats after the end (with their calls)."""
    out: list[str] = []
    log = [
        json.loads(line) for line in log_path.read_text(errors="replace").splitlines() if line.startswith("{")
    ]

    def about(key: str, value: str) -> str:
        return "; ".join(
            f"{str(line.get('timestamp', ''))[11:23]} {line.get('event')} ({line.get('kind', '')})"
            for line in log
            if line.get(key) == value
        )

    def key(pod: dict[str, Any]) -> tuple[str, str]:
        return pod["metadata"]["namespace"], pod["metadata"]["name"]

    counts = Counter(key(pod) for pod in kube.evictions)
    twice = sorted(
        {(key(pod), str(pod["spec"].get("nodeName"))) for pod in kube.evictions if counts[key(pod)] > 1}
    )
    for (namespace, name), node in twice[:most]:
        out.append(f"evicted twice: {namespace}/{name} on {node}: {about('node', node)}")
    calls = sandbox.aws.calls()
    for action in sandbox.aws.actions(status="timed-out")[:most]:
        made = [
            f"{str(c.time)[11:23]} {c.operation} {c.outcome[:40]}"
            for c in calls
            if action.token in (c.action_token, c.token)
        ]
        started = str(action.started_at)[11:23]
        out.append(f"timed out: {action.instance_id} {action.hook_name} opened {started}, calls {made}")
        out.append(f"  log: {about('instance_id', action.instance_id)}")
    late = [
        c
        for c in calls
        if c.operation == "RecordLifecycleActionHeartbeat"
        and ("No active Lifecycle Action" in c.outcome or c.held is False)
    ]
    for call in late[:most]:
        when = str(call.time)[11:23]
        out.append(f"heartbeat after the end: {when} {call.instance_id} held={call.held} {call.outcome[:60]}")
    return out


def _progress(soak: Soak, sandbox: Sandbox, port: int, pid: int, sim: float) -> None:
    counts = _queue_counts(sandbox, soak)
    queue = "down" if counts is None else f"{counts[0]}+{counts[1]} dlq {counts[2]}"
    actions = Counter(action.status for action in sandbox.aws.actions())
    met = soak.faults_met()
    memory = _memory(pid)
    metrics = _metrics(port)
    print(
        f"[{sim:6.0f} s sim] incidents {sum(soak.incidents.values())} launched {soak.launched} "
        f"published {soak.messages_published()} (dup {soak.duplicates}, poison {soak.poison}) | queue {queue} | "
        f"actions done {actions['completed']} open {actions['open']} timed-out {actions['timed-out']} | "
        f"faults {sum(soak.injected.values())} injected, {sum(met.values())} met | "
        f"rss {memory.get('VmRSS', 0) / 1024:.1f} MiB fds {_fds(pid)} threads {memory.get('Threads')} "
        f"ops {int(total(metrics, 'queue_processor_in_flight_operations'))}",
        flush=True,
    )


if __name__ == "__main__":
    main()
