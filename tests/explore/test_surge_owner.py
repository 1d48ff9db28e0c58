"""The explorer's surge judge (pure parts, on a fake Deployment and a made-up history of Ready pods): a pod the
controller evicted after saying its replacement was available must not leave the Deployment without a Ready pod,
unless a node went just before; the Deployment ends at its owner's count with no surge recorded."""

from __future__ import annotations

from typing import Any

from queue_processor_sandbox.surge_owner import AVAILABLE, FALLBACK, NODE_GONE_SLACK_S, WINDOW_S, SurgeOwner


class _Ready:
    def __init__(self, history: list[tuple[float, frozenset[str]]]) -> None:
        self.history = history

    def stop(self) -> None:
        pass


class _Kube:
    def __init__(self, deployment: dict[str, Any]) -> None:
        self.deployment = deployment

    def get_raw(self, path: str) -> dict[str, Any]:
        return self.deployment


def owner(history: list[tuple[float, frozenset[str]]], replicas: int = 1, record: bool = False) -> SurgeOwner:
    judge = SurgeOwner.__new__(SurgeOwner)
    annotations = {"queue-processor/surge": '{"base":1,"replicas":2,"pods":{"u":"old"}}'} if record else {}
    judge.kube = _Kube({"metadata": {"annotations": annotations}, "spec": {"replicas": replicas}})  # type: ignore[assignment]
    judge.namespace, judge.declared, judge.gone, judge.unseen = "apps", 1, [], 0
    judge.ready = _Ready(history)  # type: ignore[assignment]
    return judge


def claim(pod: str, at: float, event: str = AVAILABLE) -> dict[str, Any]:
    stamp = f"2026-11-28T00:00:{at:09.6f}Z"
    return {"timestamp": stamp, "event": event, "pod": f"apps/{pod}"}


BASE = 1_795_824_000.0  # 2026-11-28T00:00:00Z


def test_an_eviction_said_available_that_leaves_no_ready_pod_fails() -> None:
    history = [(BASE + 1, frozenset({"old"})), (BASE + 3, frozenset())]
    assert set(owner(history).verdicts([claim("old", 2)], False)) == {"surge-unready"}


def test_an_eviction_whose_replacement_is_ready_holds() -> None:
    history = [
        (BASE + 1, frozenset({"old"})),
        (BASE + 2, frozenset({"old", "new"})),
        (BASE + 3, frozenset({"new"})),
    ]
    assert owner(history).verdicts([claim("old", 2.5)], False) == {}


def test_a_node_gone_just_before_excuses_a_deployment_left_unready() -> None:
    history = [(BASE + 1, frozenset({"old", "new"})), (BASE + 3, frozenset())]
    judge = owner(history)
    judge.gone = [BASE + 3 - NODE_GONE_SLACK_S / 2]  # the replacement's node went with its instance
    assert judge.verdicts([claim("old", 2)], False) == {}


def test_a_replacement_taken_away_by_the_owners_count_after_the_claim_fails() -> None:
    # The owner's self-heal wrote the count back: the ReplicaSet deleted the replacement a moment after the old
    # pod's eviction, which the controller had let go as if its replacement stayed.
    history = [
        (BASE + 1, frozenset({"old", "new"})),
        (BASE + 3, frozenset({"new"})),
        (BASE + 3.5, frozenset()),
        (BASE + 9, frozenset({"newer"})),
    ]
    assert set(owner(history).verdicts([claim("old", 2)], False)) == {"surge-unready"}
    # Unready only long after the claim: another story.
    late = [
        (BASE + 1, frozenset({"old", "new"})),
        (BASE + 3, frozenset({"new"})),
        (BASE + 3 + WINDOW_S, frozenset()),
    ]
    assert owner(late).verdicts([claim("old", 2)], False) == {}
    # The replacement itself went by a surge that fell back (its own node's time ran short): excused.
    fell_back = claim("new", 3.2, event=f"surge: too little time before the eviction must start: {FALLBACK}")
    assert owner(history).verdicts([claim("old", 2), fell_back], False) == {}


def test_the_deployment_ends_at_its_owners_count_without_a_surge_record() -> None:
    assert set(owner([], replicas=2).verdicts([], False)) == {"deployment-count"}
    assert "surges recorded" in owner([], record=True).verdicts([], False)["deployment-count"]
    assert owner([]).verdicts([], False) == {}
    # A replica killed mid-surge leaves its record and its replica, as documented, until the next surge.
    assert owner([], replicas=2, record=True).verdicts([], True) == {}
    assert set(owner([], replicas=3, record=True).verdicts([], True)) == {"deployment-count"}
    # The owner wrote 2 while a surge held 2 (it reads as ours): the surge's take-back lowered it.
    unseen = owner([], replicas=1)
    unseen.declared, unseen.unseen = 2, 1
    assert unseen.verdicts([], False) == {}
