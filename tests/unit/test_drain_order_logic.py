"""The pure pieces of drain order and deadline-aware grace (queue_processor.drain.plan)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from queue_processor.drain.plan import (
    DEFAULT_GRACE_S,
    DrainBounds,
    DrainOptions,
    DrainOrder,
    DrainPolicy,
    DrainTiming,
    drain_policy,
    own_grace,
    plan_waves,
    wave_of,
    workload_of,
)


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def waves(pods: list[dict[str, Any]], order: DrainOrder) -> list[list[str]]:
    """The names of ``pods`` in each wave a drain plans for them (:func:`plan_waves`)."""
    planned = plan_waves(pods, DrainOptions(), DrainTiming(order=order), -1)
    return [[entry.key[1] for entry in wave] for wave in planned.waves]


def is_critical(pod: dict[str, Any], threshold: int = 2_000_000_000) -> bool:
    """Whether ``pod`` is critical: evicted in the last wave with DRAIN_ORDER=waves (:func:`wave_of`)."""
    return wave_of(pod, DrainOrder.WAVES, threshold) == 1


def granted_grace(own_s: int, until_end_s: float | None, margin_s: float) -> tuple[int, bool]:
    """The grace a drain asks for ``own_s`` ``until_end_s`` before the instance's end (:meth:`DrainBounds.grace`)."""
    bounds = DrainBounds(deadline=0.0, instance_end=until_end_s)
    return bounds.grace(own_s, DrainTiming(grace_margin_s=margin_s), now=0.0)


def test_the_system_classes_and_high_priorities_are_critical() -> None:
    assert is_critical(pod("a", priorityClassName="system-node-critical"))
    assert is_critical(pod("b", priorityClassName="system-cluster-critical", priority=0))
    assert is_critical(pod("c", priority=2_000_000_000))
    assert not is_critical(pod("d", priority=1_000_000_000))
    assert is_critical(pod("d", priority=1_000_000_000), threshold=1_000_000)
    assert not is_critical(pod("e", priority=True))  # a mistyped field counts as absent
    assert not is_critical({"spec": None})


def test_waves_put_critical_pods_last_and_keep_the_order_within_a_wave() -> None:
    pods = [
        pod("mesh", priority=2_000_000_000),
        pod("a"),
        pod("logs", priorityClassName="system-node-critical"),
        pod("b"),
    ]
    assert waves(pods, DrainOrder.WAVES) == [["a", "b"], ["mesh", "logs"]]
    assert len(waves(pods, DrainOrder.ALL_AT_ONCE)) == 1
    assert waves([pod("a")], DrainOrder.WAVES) == [["a"]]  # no empty wave
    assert waves([], DrainOrder.WAVES) == []


def test_own_grace_is_the_override_else_the_pods_else_the_default() -> None:
    assert own_grace(pod("a", terminationGracePeriodSeconds=90)) == 90
    assert own_grace(pod("a", terminationGracePeriodSeconds=90), override_s=5) == 5
    assert own_grace(pod("a")) == DEFAULT_GRACE_S
    assert own_grace(pod("a", terminationGracePeriodSeconds="90")) == DEFAULT_GRACE_S


def test_grace_is_cut_to_end_the_margin_before_the_instance() -> None:
    assert granted_grace(300, until_end_s=100.0, margin_s=10) == (90, True)
    assert granted_grace(30, until_end_s=100.0, margin_s=10) == (30, False)
    assert granted_grace(300, until_end_s=None, margin_s=10) == (300, False)  # no known end
    assert granted_grace(300, until_end_s=100.0, margin_s=-1) == (300, False)  # the cut is off
    assert granted_grace(300, until_end_s=3.0, margin_s=10) == (1, True)  # at least 1 s
    assert granted_grace(0, until_end_s=3.0, margin_s=10) == (0, False)


@given(
    own=st.integers(min_value=0, max_value=100_000),
    until_end=st.floats(min_value=-1000, max_value=100_000, allow_nan=False),
    margin=st.floats(min_value=0, max_value=3600, allow_nan=False),
)
def test_a_granted_grace_never_exceeds_the_pods_own_and_ends_by_the_margin_when_it_can(
    own: int, until_end: float, margin: float
) -> None:
    granted, cut = granted_grace(own, until_end, margin)
    assert 0 <= granted <= own
    assert cut == (granted < own)
    if cut:
        assert granted >= 1
        assert granted <= max(1, until_end - margin)


def annotated(name: str, value: str | None, **metadata: Any) -> dict[str, Any]:
    annotations = {} if value is None else {"queue-processor/drain": value}
    return {"metadata": {"name": name, "annotations": annotations, **metadata}, "spec": {}}


def test_the_drain_policy_annotation_names_evict_or_last_and_anything_else_is_reported() -> None:
    assert drain_policy(annotated("a", None)) == (DrainPolicy.EVICT, None)
    assert drain_policy(annotated("b", "evict")) == (DrainPolicy.EVICT, None)
    assert drain_policy(annotated("c", " last ")) == (DrainPolicy.LAST, None)
    assert drain_policy(annotated("d", "Last")) == (DrainPolicy.EVICT, "Last")  # values are lower case
    assert drain_policy(annotated("e", "")) == (DrainPolicy.EVICT, "")
    assert drain_policy({"metadata": {"annotations": "not a map"}}) == (DrainPolicy.EVICT, None)
    assert drain_policy({}) == (DrainPolicy.EVICT, None)


@given(st.text(max_size=20))
def test_a_drain_policy_is_always_one_of_the_known_or_reported(value: str) -> None:
    policy, unknown = drain_policy(annotated("p", value))
    assert policy in DrainPolicy
    assert (unknown is None) == (value.strip() in {p.value for p in DrainPolicy})


def test_last_puts_a_pod_in_the_last_wave_whatever_its_priority_and_the_order() -> None:
    pods = [annotated("agent", "last"), pod("web"), annotated("cache", "lats")]
    for order in DrainOrder:
        assert waves(pods, order) == [["web", "cache"], ["agent"]]
        assert wave_of(pods[0], order) == 1


def test_a_workload_is_its_controller_and_a_replicasets_deployment() -> None:
    def owned(kind: str, name: str, **labels: str) -> dict[str, Any]:
        owner = {"kind": kind, "name": name, "controller": True}
        return {"metadata": {"name": "p", "namespace": "apps", "labels": labels, "ownerReferences": [owner]}}

    assert workload_of(owned("ReplicaSet", "web-5d8f7c", **{"pod-template-hash": "5d8f7c"})) == (
        "apps/Deployment/web"
    )
    assert workload_of(owned("ReplicaSet", "batch")) == "apps/ReplicaSet/batch"
    assert workload_of(owned("StatefulSet", "db")) == "apps/StatefulSet/db"
    assert workload_of({"metadata": {"name": "lonely", "namespace": "apps"}}) == "apps/Pod/lonely"
    assert workload_of({}) == "default/Pod/None"
