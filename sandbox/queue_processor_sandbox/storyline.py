"""Storylines: seeded random sequences of what happens to real clusters, for the explorer (pure, no I/O).

DESIGN.md rule 14: every behaviour is exercised in generated combinations, not only in its own tests. A
:class:`Storyline` is what one seed makes: a cluster of 3 to 10 nodes in one or two Auto Scaling groups, one to
three controller replicas, and a list of :class:`Step`\\ s at simulated times, drawn from the events and faults
real clusters meet:

- interruptions of an instance (by its slot, the index of the instance in the cluster as it was built):
  rebalance recommendations, Spot warnings (``terminate``, ``stop``, ``hibernate``), ASG scale-in through the
  terminate hook, a scale-in into the warm pool, an EC2 stop (and, later, a start), an AWS Health scheduled
  change (the instance retired when it starts), a Capacity Reservation interruption;
- the group's scale-out through its launch hook (sometimes of an instance whose node never turns Ready), and a
  warm-pool instance moved back into the group;
- the cluster's side: a PodDisruptionBudget that blocks evictions for a while then relaxes, the Node of an
  instance deleted mid-drain;
- the controllers' side: the second replica paused (SIGSTOP, then SIGCONT), killed (SIGKILL) or stopped
  (SIGTERM: its operations end, its claims are released and its own Lease deleted), then started again;
- faults of the sandbox's injectors: the Kubernetes API (500, 429 with Retry-After, slow answers, connection
  resets; emulation only; for one seed in three with faults and a restarted replica, its node list slowed as it
  restarts) and AWS (throttled heartbeats and completions);
- delivery: each message is sent again, later, with the storyline's duplicate probability (at least once
  delivery, and out of order: the copy arrives after what was published since);
- the API server's watches: for one seed in five, its history compacted and its watches dropped halfway
  (:attr:`Storyline.compaction_at_s`; emulation only).

Where features meet (:func:`_combined`, from a random stream of the seed's own, so every seed keeps the steps
it had): Spot warnings following rebalance recommendations, starts and warm-pool moves of the same instance
(some with a budget held until past the warning's notice), a third replica, the first replica's own pod on an
interrupted node (:attr:`Storyline.own_slot`), DELETE_AT_DEADLINE (:attr:`Storyline.delete_at_deadline`) and SQS
failing settlements.

Surges (:func:`_surging`, a stream of their own again; the real control plane only, whose kube-controller-manager
runs Deployments): for one seed in three a single-replica Deployment whose pods ask for a replacement first, on
a node that leaves with time to spare (:attr:`Storyline.surge_slot`), and its owner's hand on its replica count:
a GitOps self-heal that sets the count it declares back whenever it drifts (``self-heal``, from a moment around
that node's interruption), and sometimes a new count (``owner-scale``).

A step names its target by slot or group index; the runner (:mod:`queue_processor_sandbox.explore`) skips a
step whose target is not in a state it applies to (an instance already gone) and records it. The same seed
always makes the same storyline; :meth:`Storyline.only` keeps a subset of its steps (shrinking).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from random import Random
from typing import Literal

__all__ = ["FAULT_KINDS", "INTERRUPTIONS", "Step", "Storyline", "generate"]

StepKind = Literal[
    "rebalance",
    "spot",
    "spot-stop",
    "spot-hibernate",
    "scale-in",
    "to-warm-pool",
    "stop",
    "start",
    "health",
    "capacity-reservation",
    "scale-out",
    "scale-out-never-ready",
    "from-warm-pool",
    "pdb-hold",
    "pdb-release",
    "delete-node",
    "pause-replica",
    "resume-replica",
    "kill-replica",
    "stop-replica",
    "restart-replica",
    "kube-fault",
    "aws-fault",
    "self-heal",
    "owner-scale",
]

#: Interruptions of one instance, with their weights.
INTERRUPTIONS: dict[StepKind, int] = {
    "rebalance": 3,
    "spot": 3,
    "spot-stop": 1,
    "spot-hibernate": 1,
    "scale-in": 4,
    "to-warm-pool": 2,
    "stop": 2,
    "health": 2,
    "capacity-reservation": 1,
}

#: Faults a step may inject: Kubernetes (``how`` for ``verb resource``) and AWS (an operation throttled).
FAULT_KINDS: dict[str, tuple[str, ...]] = {
    "kube": ("500", "429", "slow", "reset"),
    "kube-target": ("list pods", "create pods/eviction", "patch nodes", "get nodes", "update leases"),
    "aws": ("RecordLifecycleActionHeartbeat", "CompleteLifecycleAction"),
}


@dataclass(frozen=True)
class Step:
    """One thing that happens at ``at_s`` simulated seconds into the storyline: ``kind`` to the instance in
    slot ``target`` (or, for ``scale-out``/``from-warm-pool``, to group ``target``; for ``pdb-*`` the app
    ``target``; for faults and replicas, ``target`` is unused), with ``detail`` (a fault's shape, a notice's or a
    pause's length in simulated seconds)."""

    at_s: float
    kind: StepKind
    target: int = 0
    detail: str = ""

    def describe(self) -> str:
        """``"t=12.0s spot slot 3"``: one line for the explorer's output."""
        what = f"t={self.at_s:.1f}s {self.kind} {self.target}"
        return f"{what} ({self.detail})" if self.detail else what


@dataclass(frozen=True)
class Storyline:
    """What one seed makes: ``nodes`` instances over ``asgs`` groups, ``replicas`` controller processes (with
    NODE_LEASES when more than one), ``apps`` ReplicaSets under PodDisruptionBudgets, the probability
    ``duplicates`` that a published message is delivered again (``duplicate_delay_s`` simulated seconds at
    most later), ``faults`` (whether fault steps may be drawn) and the ``steps`` in time order."""

    seed: int
    nodes: int
    asgs: int
    replicas: int
    apps: int
    duplicates: float
    duplicate_delay_s: float
    faults: bool
    steps: tuple[Step, ...] = field(default_factory=tuple)
    own_slot: int | None = None
    """The slot of the node the first replica's own pod runs on (the controller drains its own node), or
    ``None``: its pod runs on no node of the cluster."""
    delete_at_deadline: bool = False
    """DELETE_AT_DEADLINE for the storyline's controllers: what a budget holds is deleted before a notice's
    end, so a budget held no longer excuses a pod left on a node whose notice ended."""
    surge_slot: int | None = None
    """The slot of the node a single-replica Deployment's pod (``queue-processor/drain: surge``) starts on, with
    SURGE_DRAINS; ``None``: no such Deployment. The real control plane only (the emulation runs no
    Deployments: the storyline's owner steps are skipped there)."""

    @property
    def last_pods(self) -> int:
        """Pods annotated ``queue-processor/drain: last`` in the cluster (0 to 2; from the seed, so that the
        storylines seeds made before it keep their steps)."""
        return self.seed % 3

    @property
    def non_urgent_budget(self) -> str:
        """DRAIN_BUDGET_NON_URGENT for the storyline's controllers: ``"1"`` for one seed in four (rebalance
        drains take turns, one per group), else empty (from the seed, so the older seeds keep their steps)."""
        return "1" if self.seed % 4 == 3 else ""

    @property
    def evictions_in_flight(self) -> str:
        """EVICTIONS_IN_FLIGHT for the storyline's controllers: ``"2"`` for odd seeds (drains wait for the
        slots of their evictions, together with everything else the storyline does to them), else empty (the
        default, never reached by a storyline's few pods). From the seed, so the older seeds keep their steps."""
        return "2" if self.seed % 2 == 1 else ""

    @property
    def compaction_at_s(self) -> float | None:
        """When (simulated seconds) the API server forgets the changes it keeps for watches and drops the
        watches it serves (etcd compaction, then a restart: every watch of the controllers, pods and nodes, is
        told 410 and lists again), halfway through the storyline, for one seed in five; ``None`` otherwise.
        The emulation only (the real control plane's etcd is not compacted here). From the seed, so that the
        storylines seeds made before it keep their steps."""
        return round(self.length_s / 2, 1) if self.seed % 5 == 2 else None

    @property
    def length_s(self) -> float:
        """Simulated seconds until the last step."""
        return max((step.at_s for step in self.steps), default=0.0)

    def only(self, keep: set[int]) -> Storyline:
        """The same storyline with only the steps whose index is in ``keep`` (shrinking)."""
        return replace(self, steps=tuple(step for index, step in enumerate(self.steps) if index in keep))

    def describe(self) -> str:
        """One line: the cluster, the controllers and how many steps."""
        return (
            f"nodes={self.nodes} asgs={self.asgs} replicas={self.replicas} apps={self.apps} "
            f"last_pods={self.last_pods} turns={self.non_urgent_budget or 'off'} "
            f"evictions_in_flight={self.evictions_in_flight or 'default'} "
            f"compaction={'off' if self.compaction_at_s is None else f't={self.compaction_at_s}s'} "
            f"duplicates={self.duplicates:.2f} faults={'on' if self.faults else 'off'} "
            f"own_node={'off' if self.own_slot is None else self.own_slot} "
            f"delete_at_deadline={'on' if self.delete_at_deadline else 'off'} "
            f"surge={'off' if self.surge_slot is None else self.surge_slot} steps={len(self.steps)}"
        )


def generate(seed: int) -> Storyline:
    """The storyline of ``seed`` (the same every time)."""
    rng = Random(seed)
    nodes = rng.randint(3, 10)
    asgs = rng.choice((1, 2))
    replicas = rng.choice((1, 1, 2))
    apps = rng.randint(1, 3)
    faults = rng.random() < 0.5
    steps: list[Step] = []
    at = 0.0
    interrupted: set[int] = set()
    for _ in range(rng.randint(2, max(3, nodes))):
        at += rng.uniform(0.0, 40.0)
        slot = rng.randrange(nodes)
        kind = rng.choices(list(INTERRUPTIONS), list(INTERRUPTIONS.values()))[0]
        detail = ""
        if kind == "health":
            detail = f"{rng.uniform(60, 240):.0f}"  # the scheduled start, simulated seconds from now
        elif kind == "capacity-reservation":
            detail = f"{rng.uniform(60, 180):.0f}"  # the notice
        steps.append(Step(round(at, 1), kind, slot, detail))
        interrupted.add(slot)
        if kind == "stop" and rng.random() < 0.7:  # most stopped instances are started again
            steps.append(Step(round(at + rng.uniform(30, 120), 1), "start", slot))
        if kind == "to-warm-pool" and rng.random() < 0.7:  # and most warm-pool instances come back
            steps.append(Step(round(at + rng.uniform(30, 120), 1), "from-warm-pool", slot % asgs))
        if rng.random() < 0.15:  # the node goes while the controller drains it
            steps.append(Step(round(at + rng.uniform(1, 10), 1), "delete-node", slot))
    for _ in range(rng.choice((0, 0, 1, 2))):
        kind = "scale-out-never-ready" if rng.random() < 0.3 else "scale-out"
        steps.append(Step(round(rng.uniform(0, at + 10), 1), kind, rng.randrange(asgs)))
    if rng.random() < 0.4:  # a budget that blocks for a while, then relaxes
        start = rng.uniform(0, at)
        app = rng.randrange(apps)
        steps.append(Step(round(start, 1), "pdb-hold", app))
        steps.append(Step(round(start + rng.uniform(20, 120), 1), "pdb-release", app))
    if replicas > 1 and rng.random() < 0.6:
        start = rng.uniform(0, at + 10)
        if rng.random() < 0.5:
            pause = rng.uniform(5, 400)  # sometimes longer than a node Lease lasts
            steps.append(Step(round(start, 1), "pause-replica", 1, f"{pause:.0f}"))
            steps.append(Step(round(start + pause, 1), "resume-replica", 1))
        else:
            # SIGTERM rather than SIGKILL for half the seeds, from the seed (the older seeds keep their steps).
            steps.append(Step(round(start, 1), "stop-replica" if (seed // 2) % 2 else "kill-replica", 1))
            restart = round(start + rng.uniform(20, 200), 1)
            steps.append(Step(restart, "restart-replica", 1))
            if faults and seed % 3 == 0:
                # The restarted replica's watched copy of the nodes comes in slowly: its claims and cordons wait
                # for it, FIRST_COPY_WAIT_S at most (from the seed: the rng's stream, and so every other step, is
                # unchanged).
                steps.append(Step(restart, "kube-fault", 0, "slow list nodes x3"))
    if faults:
        for _ in range(rng.randint(1, 4)):
            when = round(rng.uniform(0, at + 10), 1)
            if rng.random() < 0.6:
                how = rng.choice(FAULT_KINDS["kube"])
                target = rng.choice(FAULT_KINDS["kube-target"])
                times = rng.randint(1, 3)
                steps.append(Step(when, "kube-fault", 0, f"{how} {target} x{times}"))
                if target == "update leases" and seed % 2:
                    # Node Lease releases go in batches (deletecollection), faulted too for odd seeds: from the
                    # seed, so that every seed keeps the steps it had.
                    steps.append(Step(when, "kube-fault", 0, f"{how} deletecollection leases x{times}"))
            else:
                operation = rng.choice(FAULT_KINDS["aws"])
                steps.append(Step(when, "aws-fault", 0, f"Throttling {operation} x{rng.randint(1, 2)}"))
    steps.sort(key=lambda step: step.at_s)
    story = Storyline(
        seed=seed,
        nodes=nodes,
        asgs=asgs,
        replicas=replicas,
        apps=apps,
        duplicates=round(rng.choice((0.0, 0.1, 0.3)), 2),
        duplicate_delay_s=30.0,
        faults=faults,
        steps=tuple(steps),
    )
    return _surging(_combined(story))


#: Follow-ups of a step that land one instance's events on different replicas: (kind followed, probability,
#: the follow-up's kind, its delay range in simulated seconds).
FOLLOW_UPS: tuple[tuple[StepKind, float, StepKind, tuple[float, float]], ...] = (
    ("rebalance", 0.5, "spot", (5.0, 60.0)),  # the usual order: a recommendation, then the warning
    ("start", 0.3, "spot", (10.0, 40.0)),  # stopped, started again, then interrupted
    ("to-warm-pool", 0.2, "spot", (2.0, 20.0)),
)

#: Settlement faults: SQS answers a message's delete or visibility change with a 500 (``InternalError``).
SETTLEMENT_FAULTS = ("DeleteMessageBatch", "ChangeMessageVisibility", "ChangeMessageVisibilityBatch")


def _combined(story: Storyline) -> Storyline:
    """``story`` with the combinations of features that found defects where two of them meet (issue 47),
    drawn from a random stream of their own, so that every seed keeps the steps it had and gains some: Spot
    warnings following rebalance recommendations, starts and warm-pool moves of the same instance (with two or
    three replicas, often received by another replica than the one draining), a third replica for some
    two-replica seeds, the first replica's own pod on an interrupted node, DELETE_AT_DEADLINE, and SQS
    answering a settlement with a 500."""
    rng = Random(story.seed * 1_000_003 + 47)
    steps = list(story.steps)
    for step in story.steps:
        for kind, chance, follow, (low, high) in FOLLOW_UPS:
            if step.kind == kind and rng.random() < chance:
                then = round(step.at_s + rng.uniform(low, high), 1)
                steps.append(Step(then, follow, step.target))
                if kind == "rebalance" and rng.random() < 0.3:
                    # The recommendation's drain held by a budget until after the warning's notice: only the
                    # warning's end (DELETE_AT_DEADLINE) moves what it holds, whichever replica receives it.
                    app = rng.randrange(story.apps)
                    steps.append(Step(step.at_s, "pdb-hold", app))
                    steps.append(Step(round(then + 130.0, 1), "pdb-release", app))
    replicas = 3 if story.replicas == 2 and rng.random() < 0.3 else story.replicas
    interrupted = sorted({step.target for step in steps if step.kind in INTERRUPTIONS})
    own_slot = rng.choice(interrupted) if interrupted and rng.random() < 0.2 else None
    delete_at_deadline = rng.random() < 1 / 3
    if story.faults and rng.random() < 0.5:
        last = max((step.at_s for step in steps), default=0.0)
        operation = rng.choice(SETTLEMENT_FAULTS)
        steps.append(
            Step(round(rng.uniform(0, last + 10), 1), "aws-fault", 0, f"InternalError {operation} x6")
        )
    steps.sort(key=lambda step: step.at_s)
    return replace(
        story, replicas=replicas, own_slot=own_slot, delete_at_deadline=delete_at_deadline, steps=tuple(steps)
    )


#: Interruptions that leave a surge its time (a lifecycle action's, or a recommendation's open end).
SURGE_ROOM: tuple[StepKind, ...] = ("scale-in", "to-warm-pool", "rebalance")


def _surging(story: Storyline) -> Storyline:
    """``story`` with, for one seed in three, a Deployment that surges (:attr:`Storyline.surge_slot`) on a node
    interrupted with time to spare (a scale-in added when none is), and its owner: for two in three of those
    seeds a GitOps self-heal from up to 20 simulated seconds before that interruption to 20 after it (the owner
    sets the count it declares back whenever it drifts, ``detail`` simulated seconds, 0 to 4, after it sees the
    drift: while the surge waits for its replacement), and for one in three an ``owner-scale`` to 2
    (``detail``). From a random stream of its own: every seed keeps its other steps."""
    rng = Random(story.seed * 1_000_003 + 4748)
    if rng.random() >= 1 / 3:
        return story
    steps = list(story.steps)
    roomy = [step for step in steps if step.kind in SURGE_ROOM]
    if roomy:
        chosen = rng.choice(roomy)
    else:
        chosen = Step(
            round(rng.uniform(5, max(10.0, story.length_s)), 1), "scale-in", rng.randrange(story.nodes)
        )
        steps.append(chosen)
    if rng.random() < 2 / 3:
        when = round(max(0.0, chosen.at_s + rng.uniform(-20, 20)), 1)
        steps.append(Step(when, "self-heal", 0, f"{rng.uniform(0, 4):.1f}"))
    if rng.random() < 1 / 3:
        steps.append(Step(round(rng.uniform(0, chosen.at_s + 40), 1), "owner-scale", 0, "2"))
    steps.sort(key=lambda step: step.at_s)
    return replace(story, surge_slot=chosen.target % story.nodes, steps=tuple(steps))
