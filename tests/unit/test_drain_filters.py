"""kubectl-drain pod filters: each filter and its switch, their order, and properties over generated pods."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_processor.drain.plan import (
    FILTERS,
    MIRROR_POD_ANNOTATION,
    DrainOptions,
    DrainPlan,
    FilterStatus,
    PodDecision,
    Verdict,
    controller_of,
    daemonset_filter,
    finished_filter,
    is_finished,
    is_terminating,
    local_storage_filter,
    mirror_filter,
    own_pod_filter,
    plan_drain,
    pod_key,
    terminating_filter,
    unreplicated_filter,
)

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
DEFAULTS = DrainOptions()
STRICT = DrainOptions(ignore_daemonsets=False, delete_emptydir_data=False, force=False)


def rfc3339(moment: datetime) -> str:
    """A time as the API writes it: ``2024-05-01T12:00:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_pod(
    name: str = "web-1",
    namespace: str = "default",
    *,
    owner: str | None = "ReplicaSet",
    controller: bool = True,
    annotations: dict[str, str] | None = None,
    empty_dir: bool = False,
    phase: str = "Running",
    deleted: datetime | str | None = None,
) -> dict[str, Any]:
    """A pod in the API's JSON shape; ``owner`` is the kind of its owner reference (``None``: no owner)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner, "name": "owner", "uid": "u", "controller": controller}
        ]
    if annotations is not None:
        metadata["annotations"] = annotations
    if deleted is not None:
        metadata["deletionTimestamp"] = rfc3339(deleted) if isinstance(deleted, datetime) else deleted
    volumes: list[dict[str, Any]] = [{"name": "token", "projected": {"sources": []}}]
    if empty_dir:
        volumes.append({"name": "scratch", "emptyDir": {}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"nodeName": "ip-10-0-0-1.ec2.internal", "volumes": volumes},
        "status": {"phase": phase},
    }


def decide(pod: dict[str, Any], options: DrainOptions = DEFAULTS, now: datetime = NOW) -> PodDecision:
    """The one decision on one pod."""
    plan = plan_drain([pod], options, now=now)
    assert len(plan.decisions) == 1
    return plan.decisions[0]


def is_in(pod: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    return any(p is pod for p in pods)


def evicted_pods(plan: DrainPlan) -> list[dict[str, Any]]:
    """The pods a drain evicts: those whose verdict is EVICT."""
    return [d.pod for d in plan.decisions if d.verdict is Verdict.EVICT]


def is_daemonset_pod(pod: dict[str, Any]) -> bool:
    """Whether :func:`daemonset_filter` takes ``pod`` for a DaemonSet's (it lets no other pod through)."""
    return daemonset_filter(pod, STRICT, NOW).verdict is not Verdict.EVICT


def is_mirror_pod(pod: dict[str, Any]) -> bool:
    """Whether :func:`mirror_filter` takes ``pod`` for a static pod's mirror."""
    return mirror_filter(pod, STRICT, NOW).verdict is not Verdict.EVICT


def waited_for(plan: DrainPlan) -> list[dict[str, Any]]:
    """The pods a drain waits for (:func:`plan_waves` keeps them): evicted or awaiting deletion."""
    return [d.pod for d in plan.decisions if d.verdict is Verdict.EVICT or d.awaiting_deletion]


# --- helpers -------------------------------------------------------------------------------------------------


def test_pod_key_reads_namespace_and_name() -> None:
    assert pod_key(make_pod("a", "kube-system")) == ("kube-system", "a")


@pytest.mark.parametrize("pod", [{}, {"metadata": None}, {"metadata": {"name": 3, "namespace": ["x"]}}])
def test_pod_key_of_a_pod_without_names_is_empty_strings(pod: dict[str, Any]) -> None:
    assert pod_key(pod) == ("", "")


def test_controller_of_returns_the_controller_reference_not_the_first_one() -> None:
    pod = make_pod(owner=None)
    pod["metadata"]["ownerReferences"] = [
        {"kind": "ConfigMap", "name": "c"},
        {"kind": "ReplicaSet", "name": "rs", "controller": False},
        {"kind": "StatefulSet", "name": "db", "controller": True},
    ]
    controller = controller_of(pod)
    assert controller is not None
    assert controller["kind"] == "StatefulSet"


@pytest.mark.parametrize(
    ("owner", "controller", "expected"),
    [
        ("DaemonSet", True, True),
        ("DaemonSet", False, False),  # an owner, not the controller: not DaemonSet-managed
        ("ReplicaSet", True, False),
        (None, True, False),
    ],
)
def test_a_daemonset_pod_is_one_whose_controller_is_a_daemonset(
    owner: str | None, controller: bool, expected: bool
) -> None:
    status = daemonset_filter(make_pod(owner=owner, controller=controller), STRICT, NOW)
    assert (status.verdict is Verdict.ERROR) is expected


def test_a_mirror_pod_is_one_with_the_annotation_whatever_its_value() -> None:
    def mirror(pod: dict[str, Any]) -> bool:
        return mirror_filter(pod, STRICT, NOW).verdict is Verdict.SKIP

    assert mirror(make_pod(annotations={MIRROR_POD_ANNOTATION: ""}))
    assert mirror(make_pod(annotations={MIRROR_POD_ANNOTATION: "0f1e2d"}))
    assert not mirror(make_pod(annotations={"kubernetes.io/config.source": "file"}))
    assert not mirror(make_pod())


def test_local_storage_is_only_a_non_null_empty_dir() -> None:
    def local(pod: dict[str, Any]) -> bool:
        return local_storage_filter(pod, STRICT, NOW).verdict is Verdict.ERROR

    assert local(make_pod(empty_dir=True))
    assert not local(make_pod())
    pod = make_pod()
    pod["spec"]["volumes"] = [{"name": "x", "emptyDir": None}, {"name": "h", "hostPath": {"path": "/tmp"}}]
    assert not local(pod)


@pytest.mark.parametrize(("phase", "expected"), [("Succeeded", True), ("Failed", True), ("Running", False)])
def test_is_finished(phase: str, expected: bool) -> None:
    assert is_finished(make_pod(phase=phase)) is expected


def deleted_at(pod: dict[str, Any], moment: datetime) -> bool:
    """Whether :func:`terminating_filter` reads ``pod``'s deletionTimestamp as ``moment`` (to the microsecond): 10 s
    later, the pod is just old enough for a 10 s skip-wait timeout less 1 µs, not for 10 s."""
    now = moment + timedelta(seconds=10)

    def awaited(timeout_s: float) -> bool:
        options = DrainOptions(skip_wait_for_delete_timeout_s=timeout_s)
        return terminating_filter(pod, options, now).awaiting_deletion

    return awaited(10) and not awaited(10 - 1e-6)


def test_the_deletion_timestamp_is_read_from_rfc3339_and_datetimes() -> None:
    assert deleted_at(make_pod(deleted=NOW), NOW)
    assert deleted_at(
        make_pod(deleted="2024-05-01T12:00:00.5+02:00"), datetime(2024, 5, 1, 10, 0, 0, 500_000, tzinfo=UTC)
    )
    naive = make_pod()
    naive["metadata"]["deletionTimestamp"] = datetime(2024, 5, 1, 12)  # naive: UTC
    assert deleted_at(naive, NOW)
    unreadable = make_pod(deleted="yesterday")  # waited for, however short the timeout and late the moment
    options = DrainOptions(skip_wait_for_delete_timeout_s=1e-6)
    assert terminating_filter(unreadable, options, NOW + timedelta(days=365)).awaiting_deletion
    assert terminating_filter(make_pod(), STRICT, NOW) == FilterStatus(Verdict.EVICT)  # none: not terminating
    assert is_terminating(make_pod(deleted="yesterday"))
    assert not is_terminating(make_pod())


# --- each filter on its own ----------------------------------------------------------------------------------


def test_filters_run_in_the_documented_order() -> None:
    names = [f.__name__ for f in FILTERS]
    assert names == [
        "own_pod_filter",
        "mirror_filter",
        "daemonset_filter",
        "terminating_filter",
        "finished_filter",
        "local_storage_filter",
        "unreplicated_filter",
    ]


@pytest.mark.parametrize("pod_filter", FILTERS)
def test_every_filter_lets_a_plain_replicated_pod_through(pod_filter: Any) -> None:
    assert pod_filter(make_pod(), STRICT, NOW) == FilterStatus(Verdict.EVICT)


def test_own_pod_filter() -> None:
    options = DrainOptions(own_pod=("queue-processor", "qp-7d9f"))
    assert own_pod_filter(make_pod("qp-7d9f", "queue-processor"), options, NOW).verdict is Verdict.SKIP
    assert own_pod_filter(make_pod("qp-7d9f", "default"), options, NOW).verdict is Verdict.EVICT
    assert own_pod_filter(make_pod("qp-7d9f", "queue-processor"), DEFAULTS, NOW).verdict is Verdict.EVICT


def test_mirror_filter() -> None:
    status = mirror_filter(make_pod(annotations={MIRROR_POD_ANNOTATION: "x"}), STRICT, NOW)
    assert status == FilterStatus(Verdict.SKIP, "mirror: mirror (static) pod")


@pytest.mark.parametrize(
    ("ignore", "phase", "verdict"),
    [
        (True, "Running", Verdict.SKIP),
        (False, "Running", Verdict.ERROR),
        (True, "Succeeded", Verdict.SKIP),
        (False, "Failed", Verdict.SKIP),  # finished: nothing to block on, still never evicted
    ],
)
def test_daemonset_filter(ignore: bool, phase: str, verdict: Verdict) -> None:
    status = daemonset_filter(
        make_pod(owner="DaemonSet", phase=phase), DrainOptions(ignore_daemonsets=ignore), NOW
    )
    assert status.verdict is verdict
    assert status.message.startswith("daemonset: ")
    if verdict is Verdict.ERROR:
        assert "cannot delete DaemonSet-managed Pods" in status.message


def test_terminating_filter_waits_for_a_pod_being_deleted() -> None:
    status = terminating_filter(make_pod(deleted=NOW - timedelta(seconds=5)), DEFAULTS, NOW)
    assert status == FilterStatus(Verdict.SKIP, "terminating: already being deleted", awaiting_deletion=True)


@pytest.mark.parametrize(
    ("timeout_s", "age_s", "awaited"),
    [
        (0, 86_400, True),  # off: waited for however old
        (60, 30, True),
        (60, 60, True),  # exactly the timeout: not older than it
        (60, 61, False),
        (0.5, 1, False),
    ],
)
def test_terminating_filter_skip_wait_for_delete_timeout(timeout_s: float, age_s: int, awaited: bool) -> None:
    options = DrainOptions(skip_wait_for_delete_timeout_s=timeout_s)
    status = terminating_filter(make_pod(deleted=NOW - timedelta(seconds=age_s)), options, NOW)
    assert status.verdict is Verdict.SKIP
    assert status.awaiting_deletion is awaited
    assert status.message.startswith("terminating: ")


def test_terminating_filter_waits_for_a_pod_whose_deletion_time_cannot_be_read() -> None:
    options = DrainOptions(skip_wait_for_delete_timeout_s=1)
    assert terminating_filter(make_pod(deleted="not a time"), options, NOW).awaiting_deletion


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_filter(phase: str) -> None:
    assert finished_filter(make_pod(phase=phase), STRICT, NOW) == FilterStatus(
        Verdict.EVICT, f"finished: {phase}"
    )
    assert finished_filter(make_pod(phase="Pending"), STRICT, NOW) == FilterStatus(Verdict.EVICT)


def test_local_storage_filter() -> None:
    pod = make_pod(empty_dir=True)
    assert local_storage_filter(pod, DEFAULTS, NOW) == FilterStatus(
        Verdict.EVICT, "local-storage: uses emptyDir (its data is deleted)"
    )
    refused = local_storage_filter(pod, DrainOptions(delete_emptydir_data=False), NOW)
    assert refused.verdict is Verdict.ERROR
    assert "cannot delete Pods with local storage" in refused.message
    finished = make_pod(empty_dir=True, phase="Succeeded")
    assert local_storage_filter(finished, STRICT, NOW) == FilterStatus(Verdict.EVICT)


def test_unreplicated_filter() -> None:
    pod = make_pod(owner=None)
    assert unreplicated_filter(pod, DEFAULTS, NOW) == FilterStatus(
        Verdict.EVICT, "unreplicated: no controller"
    )
    refused = unreplicated_filter(pod, DrainOptions(force=False), NOW)
    assert refused.verdict is Verdict.ERROR
    assert "cannot delete Pods that declare no controller" in refused.message
    not_controller = make_pod(owner="ReplicaSet", controller=False)
    assert unreplicated_filter(not_controller, STRICT, NOW).verdict is Verdict.ERROR
    assert unreplicated_filter(make_pod(owner=None, phase="Failed"), STRICT, NOW) == FilterStatus(
        Verdict.EVICT
    )


# --- the plan ------------------------------------------------------------------------------------------------


def test_default_options_are_nth_defaults() -> None:
    assert DrainOptions() == DrainOptions(
        ignore_daemonsets=True,
        delete_emptydir_data=True,
        force=True,
        own_pod=None,
        skip_wait_for_delete_timeout_s=0,
    )


def test_a_replicated_pod_is_evicted_and_waited_for() -> None:
    pod = make_pod()
    plan = plan_drain([pod], STRICT, now=NOW)
    assert plan.decisions == (PodDecision("default", "web-1", Verdict.EVICT, "ok", pod),)
    assert is_in(pod, evicted_pods(plan))
    assert is_in(pod, waited_for(plan))
    assert plan.skipped == []
    assert plan.errors == []


def test_the_plan_keeps_input_order_and_lists_each_verdict() -> None:
    evicted = make_pod("a")
    mirror = make_pod("b", owner="Node", annotations={MIRROR_POD_ANNOTATION: "x"})
    failed = make_pod("c", owner=None)
    terminating = make_pod("d", deleted=NOW)
    plan = plan_drain(iter([evicted, mirror, failed, terminating]), DrainOptions(force=False), now=NOW)
    assert [d.name for d in plan.decisions] == ["a", "b", "c", "d"]
    assert [d.verdict for d in plan.decisions] == [Verdict.EVICT, Verdict.SKIP, Verdict.ERROR, Verdict.SKIP]
    assert evicted_pods(plan) == [evicted]
    assert [d.name for d in plan.skipped] == ["b", "d"]
    assert [d.name for d in plan.errors] == ["c"]
    assert waited_for(plan) == [evicted, terminating]


def test_an_empty_node_has_an_empty_plan() -> None:
    plan = plan_drain([], DEFAULTS)
    assert plan == DrainPlan(())
    assert (evicted_pods(plan), plan.skipped, plan.errors, waited_for(plan)) == ([], [], [], [])


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (make_pod(annotations={MIRROR_POD_ANNOTATION: "x"}), "mirror: mirror (static) pod"),
        (make_pod(owner="DaemonSet"), "daemonset: DaemonSet-managed pod"),
        (make_pod(deleted=NOW), "terminating: already being deleted"),
        (make_pod(owner=None, empty_dir=True, phase="Succeeded"), "finished: Succeeded"),
        (make_pod(empty_dir=True), "local-storage: uses emptyDir (its data is deleted)"),
        (make_pod(owner=None), "unreplicated: no controller"),
    ],
)
def test_reasons_name_the_filter(pod: dict[str, Any], reason: str) -> None:
    assert decide(pod).reason == reason


def test_own_pod_is_skipped_whatever_else_it_is() -> None:
    options = DrainOptions(own_pod=("default", "web-1"), force=False, delete_emptydir_data=False)
    for pod in (
        make_pod(),
        make_pod(owner=None, empty_dir=True),
        make_pod(phase="Failed"),
        make_pod(deleted=NOW),
    ):
        decision = decide(pod, options)
        assert (decision.verdict, decision.reason) == (Verdict.SKIP, "own-pod")
        assert not decision.awaiting_deletion


def test_a_pod_of_the_same_name_in_another_namespace_is_not_the_own_pod() -> None:
    assert (
        decide(make_pod("web-1", "other"), DrainOptions(own_pod=("default", "web-1"))).verdict
        is Verdict.EVICT
    )


def test_a_terminating_mirror_pod_is_skipped_as_mirror_and_not_waited_for() -> None:
    pod = make_pod(owner="Node", annotations={MIRROR_POD_ANNOTATION: "x"}, deleted=NOW)
    plan = plan_drain([pod], DEFAULTS, now=NOW)
    assert plan.decisions[0].verdict is Verdict.SKIP
    assert plan.decisions[0].reason.startswith("mirror: ")
    assert waited_for(plan) == []


def test_a_mirror_pod_is_skipped_even_when_strict_options_would_refuse_it() -> None:
    pod = make_pod(owner=None, empty_dir=True, annotations={MIRROR_POD_ANNOTATION: "x"})
    assert decide(pod, STRICT).verdict is Verdict.SKIP


@pytest.mark.parametrize(
    ("ignore", "delete_data", "force", "empty_dir", "phase", "deleted"),
    list(
        itertools.product(
            [True, False], [True, False], [True, False], [True, False], ["Running", "Succeeded"], [None, NOW]
        )
    ),
)
def test_a_daemonset_pod_is_never_evicted(
    ignore: bool, delete_data: bool, force: bool, empty_dir: bool, phase: str, deleted: datetime | None
) -> None:
    options = DrainOptions(ignore_daemonsets=ignore, delete_emptydir_data=delete_data, force=force)
    pod = make_pod(owner="DaemonSet", empty_dir=empty_dir, phase=phase, deleted=deleted)
    plan = plan_drain([pod], options, now=NOW)
    decision = plan.decisions[0]
    assert decision.verdict is not Verdict.EVICT
    assert decision.reason.startswith("daemonset: ")
    assert evicted_pods(plan) == []
    assert waited_for(plan) == []
    running = phase == "Running"
    assert (decision.verdict is Verdict.ERROR) is (not ignore and running)


def test_a_terminating_pod_is_waited_for_not_evicted() -> None:
    pod = make_pod(owner=None, empty_dir=True, deleted=NOW - timedelta(minutes=1))
    plan = plan_drain([pod], STRICT, now=NOW)
    assert plan.decisions[0].verdict is Verdict.SKIP
    assert plan.decisions[0].awaiting_deletion
    assert evicted_pods(plan) == []
    assert waited_for(plan) == [pod]


def test_a_pod_deleted_longer_ago_than_the_skip_wait_timeout_is_not_waited_for() -> None:
    old = make_pod("old", deleted=NOW - timedelta(minutes=10))
    recent = make_pod("recent", deleted=NOW - timedelta(seconds=10))
    plan = plan_drain([old, recent], DrainOptions(skip_wait_for_delete_timeout_s=60), now=NOW)
    assert [d.verdict for d in plan.decisions] == [Verdict.SKIP, Verdict.SKIP]
    assert waited_for(plan) == [recent]
    assert waited_for(plan_drain([old, recent], DEFAULTS, now=NOW)) == [old, recent]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_is_evicted_whatever_the_later_filters_say(phase: str) -> None:
    decision = decide(make_pod(owner=None, empty_dir=True, phase=phase), STRICT)
    assert (decision.verdict, decision.reason) == (Verdict.EVICT, f"finished: {phase}")


def test_local_storage_switch() -> None:
    pod = make_pod(empty_dir=True)
    assert decide(pod, DrainOptions(delete_emptydir_data=True)).verdict is Verdict.EVICT
    refused = decide(pod, DrainOptions(delete_emptydir_data=False))
    assert refused.verdict is Verdict.ERROR
    assert refused.reason.startswith("local-storage: cannot delete Pods with local storage")


def test_force_switch() -> None:
    pod = make_pod(owner=None)
    assert decide(pod, DrainOptions(force=True)).verdict is Verdict.EVICT
    refused = decide(pod, DrainOptions(force=False))
    assert refused.verdict is Verdict.ERROR
    assert refused.reason.startswith("unreplicated: cannot delete Pods that declare no controller")


def test_every_warning_is_kept_in_the_reason() -> None:
    decision = decide(make_pod(owner=None, empty_dir=True))
    assert decision.verdict is Verdict.EVICT
    assert (
        decision.reason == "local-storage: uses emptyDir (its data is deleted); unreplicated: no controller"
    )


def test_an_error_reason_names_the_deciding_filter_first_then_the_warnings() -> None:
    decision = decide(make_pod(owner=None, empty_dir=True), DrainOptions(force=False))
    assert decision.verdict is Verdict.ERROR
    assert decision.reason.startswith("unreplicated: cannot delete")
    assert decision.reason.endswith("; local-storage: uses emptyDir (its data is deleted)")


def test_now_defaults_to_the_current_time_and_a_naive_now_is_utc() -> None:
    options = DrainOptions(skip_wait_for_delete_timeout_s=60)
    recent = make_pod(deleted=datetime.now(UTC) - timedelta(seconds=5))
    assert waited_for(plan_drain([recent], options)) == [recent]
    old = make_pod(deleted=NOW - timedelta(minutes=5))
    assert waited_for(plan_drain([old], options, now=NOW.replace(tzinfo=None))) == []


def test_a_decision_compares_and_prints_without_its_pod() -> None:
    a = decide(make_pod())
    b = decide(make_pod())
    assert a == b
    assert hash(a) == hash(b)
    assert "spec" not in repr(a)
    assert hash(plan_drain([make_pod()], DEFAULTS, now=NOW)) == hash(DrainPlan((a,)))


@pytest.mark.parametrize(
    "pod",
    [
        {},
        {"metadata": None, "spec": None, "status": None},
        {"metadata": {"ownerReferences": "DaemonSet", "annotations": ["kubernetes.io/config.mirror"]}},
        {"metadata": {"ownerReferences": [None, 3, {"controller": "true", "kind": "DaemonSet"}]}},
        {"spec": {"volumes": [None, "emptyDir", {"emptyDir": {}}]}, "status": {"phase": ["Failed"]}},
        {"metadata": {"deletionTimestamp": 12}},
    ],
)
def test_malformed_pods_get_a_decision(pod: dict[str, Any]) -> None:
    options = DrainOptions(own_pod=("", ""), skip_wait_for_delete_timeout_s=1)
    plan = plan_drain([pod, pod], options, now=NOW)
    assert len(plan.decisions) == 2
    assert all(d.pod is pod for d in plan.decisions)


# --- properties ----------------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
junk = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
kinds = st.sampled_from(
    ["DaemonSet", "ReplicaSet", "StatefulSet", "Job", "ReplicationController", "Node", "X"]
)
owner_references = st.lists(
    st.fixed_dictionaries(
        {"kind": kinds, "name": st.text(max_size=5)},
        optional={"controller": st.booleans() | st.none(), "apiVersion": st.sampled_from(["apps/v1", "v1"])},
    ),
    max_size=3,
)
annotation_maps = st.dictionaries(
    st.sampled_from([MIRROR_POD_ANNOTATION, "kubernetes.io/config.source", "a", "kubernetes.io/config.hash"]),
    st.text(max_size=5),
    max_size=3,
)
volume = st.fixed_dictionaries(
    {"name": st.text(max_size=5)},
    optional={
        "emptyDir": st.none() | st.just({}) | st.fixed_dictionaries({"medium": st.just("Memory")}),
        "hostPath": st.fixed_dictionaries({"path": st.just("/var/log")}),
        "configMap": st.fixed_dictionaries({"name": st.text(max_size=5)}),
    },
)
timestamps = (
    st.datetimes(
        min_value=datetime(1970, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.sampled_from([UTC, None]),
    ).map(lambda t: t.isoformat())
    | st.text(max_size=12)
    | junk
)
metadata = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "qp"]), "namespace": st.sampled_from(["default", "ops"])},
    optional={
        "annotations": annotation_maps | junk,
        "ownerReferences": owner_references | junk,
        "deletionTimestamp": timestamps,
        "uid": st.uuids().map(str),
    },
)
pods = st.fixed_dictionaries(
    {"metadata": metadata},
    optional={
        "spec": st.fixed_dictionaries({"volumes": st.lists(volume, max_size=3) | junk}) | junk,
        "status": st.fixed_dictionaries(
            {"phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]) | junk}
        )
        | junk,
    },
)
options = st.builds(
    DrainOptions,
    ignore_daemonsets=st.booleans(),
    delete_emptydir_data=st.booleans(),
    force=st.booleans(),
    own_pod=st.none() | st.tuples(st.sampled_from(["default", "ops"]), st.sampled_from(["a", "b", "qp"])),
    skip_wait_for_delete_timeout_s=st.sampled_from([0, 0.5, 30, 3600, float("inf")]),
)


@settings(max_examples=400)
@given(st.lists(pods, max_size=8), options, st.datetimes(timezones=st.sampled_from([UTC, None])))
def test_plan_properties(pod_list: list[dict[str, Any]], drain_options: DrainOptions, now: datetime) -> None:
    plan = plan_drain(pod_list, drain_options, now=now)

    # Every pod gets exactly one decision, in order, about that very pod.
    assert len(plan.decisions) == len(pod_list)
    assert all(d.pod is p for d, p in zip(plan.decisions, pod_list, strict=True))
    assert all((d.namespace, d.name) == pod_key(d.pod) for d in plan.decisions)
    assert len(evicted_pods(plan)) + len(plan.skipped) + len(plan.errors) == len(pod_list)

    for pod in evicted_pods(plan):
        assert not is_daemonset_pod(pod)
        assert not is_mirror_pod(pod)
        assert pod["metadata"].get("deletionTimestamp") is None
        assert pod_key(pod) != drain_options.own_pod
    for pod in waited_for(plan):
        assert not is_daemonset_pod(pod)
        assert not is_mirror_pod(pod)
        assert pod_key(pod) != drain_options.own_pod
    assert all(is_in(pod, waited_for(plan)) for pod in evicted_pods(plan))

    for decision in plan.decisions:
        assert decision.reason
        if decision.awaiting_deletion:
            assert decision.verdict is Verdict.SKIP
            assert is_terminating(decision.pod)
        if decision.verdict is Verdict.ERROR:
            assert "cannot delete" in decision.reason
    if drain_options.ignore_daemonsets and drain_options.delete_emptydir_data and drain_options.force:
        assert plan.errors == []
