"""Replacement before eviction, the Deployment side (:mod:`queue_processor.drain.surge`) and its place in a drain,
with a small fake API server whose Deployment keeps a resourceVersion (409 on a stale one) and reports the
available replicas a test sets. What the real Deployment and ReplicaSet controllers do with the scale-up is
judged on the real control plane (tests/sandbox/test_surge.py); the emulation, which serves no Deployments, is
checked here to fall back to eviction."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from queue_processor.cli import load_settings
from queue_processor.drain import surge as surge_module
from queue_processor.drain.drainer import Drainer
from queue_processor.drain.plan import DRAIN_POLICY_ANNOTATION, DrainBounds, DrainOptions, DrainTiming
from queue_processor.drain.surge import (
    SURGE_RECORD_ANNOTATION,
    Surge,
    Surges,
    autoscaled,
    label_selector,
    recorded_surges,
    selector_matches,
)
from queue_processor.kube import KubeClient, load_api_client
from queue_processor.observe.metrics import Metrics
from queue_processor.outcomes import KubeError, SurgeResult
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.kube import KubeSandbox
from tests.unit.test_handler import NODE, FakeKube

LABELS = {"app": "web"}


class Cluster(FakeKube):
    """One Deployment ``apps/web`` (``replicas``; ``available`` set by the test) and HorizontalPodAutoscalers;
    ``conflicts`` answers that many writes 409 first, as another writer would."""

    def __init__(self, replicas: int = 1) -> None:
        super().__init__()
        self.deployment: dict[str, Any] | None = {
            "metadata": {"name": "web", "namespace": "apps", "generation": 1, "annotations": {}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": dict(LABELS)}},
            "status": {"observedGeneration": 1, "availableReplicas": replicas},
        }
        self._bump(self.deployment)
        self.hpas: list[dict[str, Any]] = []
        self.conflicts = 0
        self.writes = 0
        self.refuse: int | None = None  # an HTTP status every Deployment request gets
        self.written = asyncio.Event()

    def add_surge_pod(self, name: str, node: str = NODE, uid: str | None = None) -> None:
        self.add_pod(name, node)
        pod = self.pods[-1]
        pod["metadata"]["uid"] = uid or f"uid-{name}"
        pod["metadata"]["labels"] = {**LABELS, "pod-template-hash": "abc12"}
        pod["metadata"]["annotations"] = {DRAIN_POLICY_ANNOTATION: "surge"}
        pod["metadata"]["ownerReferences"][0]["name"] = "web-abc12"

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # an answer takes a turn of the loop: concurrent surges interleave
        if self.refuse:
            raise KubeError(self.refuse, "Forbidden", "deployments is forbidden")
        if self.deployment is None or (namespace, name) != ("apps", "web"):
            return None
        return copy.deepcopy(self.deployment)

    async def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        assert self.deployment is not None
        if patch["metadata"]["resourceVersion"] != self.deployment["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        if self.conflicts:
            self.conflicts -= 1
            self._bump(self.deployment)  # another writer came first
            raise KubeError(409, "Conflict", "the object has been modified")
        self.writes += 1
        self.written.set()
        for key, value in patch["metadata"].get("annotations", {}).items():
            if value is None:
                self.deployment["metadata"]["annotations"].pop(key, None)
            else:
                self.deployment["metadata"]["annotations"][key] = value
        if patch["spec"]["replicas"] != self.deployment["spec"]["replicas"]:
            self.deployment["metadata"]["generation"] += 1
        self.deployment["spec"]["replicas"] = patch["spec"]["replicas"]
        self._bump(self.deployment)
        return copy.deepcopy(self.deployment)

    async def list_hpas(self, namespace: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.hpas)

    async def pods_selected(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        assert label_selector == "app=web"
        return [
            copy.deepcopy(p) for p in self.pods if (p["metadata"].get("labels") or {}).get("app") == "web"
        ]

    def becomes_available(self) -> None:
        """The controllers caught up: observed the newest generation, every replica available."""
        assert self.deployment is not None
        status = self.deployment["status"]
        status["observedGeneration"] = self.deployment["metadata"]["generation"]
        status["availableReplicas"] = self.deployment["spec"]["replicas"]

    @property
    def replicas(self) -> int:
        assert self.deployment is not None
        return int(self.deployment["spec"]["replicas"])

    @property
    def record(self) -> dict[str, str]:
        assert self.deployment is not None
        return recorded_surges(self.deployment)


# --- pure ---------------------------------------------------------------------------------------------------


def test_a_label_selector_becomes_the_query_a_list_takes() -> None:
    selector = {
        "matchLabels": {"tier": "web", "app": "shop"},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod", "staging"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "team", "operator": "Exists"},
            {"key": "zone", "operator": "NotIn", "values": ["a"]},
        ],
    }
    assert label_selector(selector) == "app=shop,tier=web,env in (prod,staging),!canary,team,zone notin (a)"


def test_a_selector_matches_labels_and_expressions_and_an_unknown_operator_selects_nothing() -> None:
    selector = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "env", "operator": "In", "values": ["p"]}],
    }
    assert selector_matches(selector, {"app": "web", "env": "p", "x": "y"})
    assert not selector_matches(selector, {"app": "web", "env": "q"})
    assert not selector_matches(selector, {"env": "p"})
    assert selector_matches(
        {"matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]}, {"app": "web"}
    )
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {"a": "b"})


def test_an_autoscaler_counts_only_when_it_targets_the_deployment() -> None:
    hpa = {"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}}}
    assert autoscaled([hpa], "web")
    assert not autoscaled([hpa], "api")
    assert not autoscaled([{"spec": {"scaleTargetRef": {"kind": "StatefulSet", "name": "web"}}}], "web")
    assert not autoscaled([{}], "web")


@pytest.mark.parametrize("text", [None, "", "not json", "[1, 2]", "7"])
def test_an_unreadable_record_reads_as_none(text: str | None) -> None:
    annotations = {} if text is None else {SURGE_RECORD_ANNOTATION: text}
    assert recorded_surges({"metadata": {"annotations": annotations}}) == {}


# --- the Deployment side -----------------------------------------------------------------------------------


async def test_a_surge_scales_up_records_the_pod_and_is_taken_back() -> None:
    kube = Cluster()
    surges = Surges(kube)  # type: ignore[arg-type]
    surge = await surges.start(Surge("apps", "web", "uid-0", "web-0"), LABELS)
    assert isinstance(surge, Surge)
    assert (kube.replicas, kube.record) == (2, {"uid-0": "web-0"})
    assert not await surges.ready(surge)  # the controller has not seen the new generation yet
    kube.becomes_available()
    assert await surges.ready(surge)
    assert await surges.end(surge)
    assert kube.replicas == 1
    assert kube.deployment is not None
    assert SURGE_RECORD_ANNOTATION not in kube.deployment["metadata"]["annotations"]  # nothing left behind
    assert not await surges.end(surge)  # taken back once


async def test_a_conflict_is_read_again_and_two_surges_of_one_deployment_count_exactly() -> None:
    kube = Cluster(replicas=3)
    kube.add_surge_pod("web-0", uid="uid-0")
    kube.add_surge_pod("web-1", uid="uid-1")
    surges = Surges(kube)  # type: ignore[arg-type]
    kube.conflicts = 2
    first = await surges.start(Surge("apps", "web", "uid-0", "web-0"), LABELS)
    second = await surges.start(Surge("apps", "web", "uid-1", "web-1"), LABELS)
    assert isinstance(first, Surge)
    assert isinstance(second, Surge)
    assert kube.replicas == 5
    kube.conflicts = 1
    assert await surges.end(second)
    assert await surges.end(first)
    assert (kube.replicas, kube.record) == (3, {})


async def test_a_pod_recorded_before_is_not_scaled_for_again() -> None:
    """The drain of a message redelivered after a SIGKILL mid-surge: the record names the pod already."""
    kube = Cluster()
    surges = Surges(kube)  # type: ignore[arg-type]
    await surges.start(Surge("apps", "web", "uid-0", "web-0"), LABELS)
    writes = kube.writes
    again = await surges.start(Surge("apps", "web", "uid-0", "web-0"), LABELS)
    assert isinstance(again, Surge)
    assert (kube.replicas, kube.writes, again.missing) == (2, writes, 0)


async def test_surges_whose_pods_are_gone_are_taken_back_with_the_next() -> None:
    kube = Cluster(replicas=3)  # 1 wanted, 2 added by surges whose take-back never came
    kube.add_surge_pod("web-live", uid="uid-live")
    assert kube.deployment is not None
    kube.deployment["metadata"]["annotations"][SURGE_RECORD_ANNOTATION] = json.dumps(
        {"base": 1, "pods": {"uid-gone-1": "web-gone-1", "uid-gone-2": "web-gone-2"}}
    )
    surge = await Surges(kube).start(Surge("apps", "web", "uid-live", "web-live"), LABELS)  # type: ignore[arg-type]
    assert isinstance(surge, Surge)
    assert (kube.replicas, kube.record) == (2, {"uid-live": "web-live"})


async def test_a_count_someone_else_scaled_back_is_not_taken_down_again() -> None:
    """A GitOps controller's self-heal (or a manual scale) sets the count back to its own during a surge: our
    replica is gone already, and taking one more would leave a single-replica Deployment with none."""
    kube = Cluster()
    surges = Surges(kube)  # type: ignore[arg-type]
    surge = await surges.start(Surge("apps", "web", "uid-0", "web-0"), LABELS)
    assert isinstance(surge, Surge)
    assert kube.deployment is not None
    kube.deployment["spec"]["replicas"] = 1  # self-heal
    assert await surges.end(surge)
    assert (kube.replicas, kube.record) == (1, {})


async def test_two_surges_of_one_deployment_each_wait_for_their_own_replacement() -> None:
    kube = Cluster(replicas=2)
    kube.add_surge_pod("web-0", uid="uid-0")
    kube.add_surge_pod("web-1", uid="uid-1")
    surges = Surges(kube)  # type: ignore[arg-type]
    first, second = await asyncio.gather(
        surges.start(Surge("apps", "web", "uid-0", "web-0"), LABELS),
        surges.start(Surge("apps", "web", "uid-1", "web-1"), LABELS),
    )
    assert isinstance(first, Surge)
    assert isinstance(second, Surge)
    assert kube.replicas == 4
    kube.becomes_available()
    assert kube.deployment is not None
    kube.deployment["status"]["availableReplicas"] = 3  # one replacement up: one more to come
    assert (await surges.ready(first), await surges.ready(second)) == (False, False)
    kube.deployment["status"]["availableReplicas"] = 4
    assert (await surges.ready(first), await surges.ready(second)) == (True, True)


async def test_a_surge_whose_deployment_went_is_over() -> None:
    kube = Cluster()
    surges = Surges(kube)  # type: ignore[arg-type]
    surge = await surges.start(Surge("apps", "web", "uid-0", "web-0"), LABELS)
    assert isinstance(surge, Surge)
    kube.deployment = None
    assert await surges.ready(surge) is None
    assert not await surges.end(surge)


@pytest.mark.parametrize(
    ("setup", "result"),
    [
        ("gone", SurgeResult.UNAVAILABLE),
        ("other-selector", SurgeResult.UNAVAILABLE),
        ("empty-selector", SurgeResult.UNAVAILABLE),  # an empty selector selects nothing, as a Deployment's
        ("forbidden", SurgeResult.UNAVAILABLE),
        ("autoscaled", SurgeResult.AUTOSCALED),
    ],
)
async def test_a_deployment_that_cannot_surge_is_left_as_it_is(setup: str, result: SurgeResult) -> None:
    kube = Cluster()
    if setup == "gone":
        kube.deployment = None
    elif setup == "other-selector":
        assert kube.deployment is not None
        kube.deployment["spec"]["selector"] = {"matchLabels": {"app": "api"}}
    elif setup == "empty-selector":
        assert kube.deployment is not None
        kube.deployment["spec"]["selector"] = {"matchLabels": {}}
    elif setup == "forbidden":
        kube.refuse = 403
    else:
        kube.hpas = [{"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}}}]
    assert await Surges(kube).start(Surge("apps", "web", "uid-0", "web-0"), LABELS) == result  # type: ignore[arg-type]
    assert kube.writes == 0


async def test_many_surges_of_one_deployment_ending_at_once_all_scale_back() -> None:
    """A drain of a node with many pods of one Deployment ends their surges together: each takes its replica
    back, however many there are, not only as many as its retries after a 409 allow."""
    kube = Cluster(replicas=2)
    surges = Surges(kube)  # type: ignore[arg-type]
    started = []
    for index in range(12):
        kube.add_surge_pod(f"web-{index}", uid=f"uid-{index}")
        started.append(await surges.start(Surge("apps", "web", f"uid-{index}", f"web-{index}"), LABELS))
    assert kube.replicas == 14
    with patch.object(surge_module.random, "uniform", lambda _a, _b: 0.0):
        ended = await asyncio.gather(*(surges.end(surge) for surge in started if isinstance(surge, Surge)))
    assert ended == [True] * 12
    assert (kube.replicas, kube.record) == (2, {})


@given(
    st.lists(st.lists(st.sampled_from(["start", "end", "conflict"]), min_size=1, max_size=3), max_size=12),
    st.integers(0, 4),
)
async def test_any_interleaving_of_surges_ends_with_the_count_it_began_with(
    batches: list[list[str]], replicas: int
) -> None:
    """Surges of several pods of one Deployment, started and ended in any order, those of a batch at once (their
    reads and writes interleaved), some writes losing to another writer: while they last the Deployment has
    one replica more per surge, and once every one has ended, the replicas it began with and no record."""
    kube = Cluster(replicas=replicas)
    surges = Surges(kube)  # type: ignore[arg-type]
    live: list[Surge] = []

    async def start(index: int) -> None:
        kube.add_surge_pod(f"web-{index}", uid=f"uid-{index}")
        started = await surges.start(Surge("apps", "web", f"uid-{index}", f"web-{index}"), LABELS)
        assert isinstance(started, Surge)
        live.append(started)

    with patch.object(surge_module.random, "uniform", lambda _a, _b: 0.0):  # a retry after a 409: at once
        for number, batch in enumerate(batches):
            steps: list[Any] = []
            for index, step in enumerate(batch):
                if step == "conflict":  # at most two writes lost to another writer in a row
                    kube.conflicts = min(kube.conflicts + 1, 2)
                elif step == "start":
                    steps.append(start(number * 10 + index))
                elif live:
                    steps.append(surges.end(live.pop(0)))
            await asyncio.gather(*steps)
            assert kube.replicas == replicas + len(live)
        kube.conflicts = 0
        await asyncio.gather(*(surges.end(surge) for surge in live))
    assert (kube.replicas, kube.record) == (replicas, {})


# --- in a drain ---------------------------------------------------------------------------------------------


def a_drain(replicas: int = 1) -> tuple[Cluster, Drainer, Metrics, list[float]]:
    kube = Cluster(replicas)
    kube.add_node()
    kube.add_surge_pod("web-0")
    metrics = Metrics(process_metrics=False)
    now = [100.0]
    drainer = Drainer(
        kube,  # type: ignore[arg-type]
        DrainOptions(),
        budget=1,
        timing=DrainTiming(surge=True),
        observer=metrics,
        clock=lambda: now[0],
    )
    return kube, drainer, metrics, now


def fake_time_bounds(
    now: list[float], window_s: float, meanwhile: Callable[[], None] | None = None
) -> DrainBounds:
    """The drain's bounds (deadline and instance end ``window_s`` from the fake clock ``now``) whose sleeps
    advance that clock instead of waiting (by 0.25 s at least), calling ``meanwhile`` first at each."""

    async def sleep_advances(seconds: float, *, wake: asyncio.Event | None = None) -> bool:
        if meanwhile is not None:
            meanwhile()
        now[0] += max(seconds, 0.25)
        await asyncio.sleep(0)
        return False

    bounds = DrainBounds(now[0] + window_s, now[0] + window_s)
    bounds.sleep = sleep_advances  # type: ignore[method-assign]
    return bounds


def surges_counted(metrics: Metrics) -> dict[str, float]:
    return {
        result.value: value
        for result in SurgeResult
        if (value := metrics.registry.get_sample_value("queue_processor_surges_total", {"result": result}))
    }


async def test_the_pod_is_evicted_only_once_the_replacement_is_available() -> None:
    kube, drainer, metrics, now = a_drain()
    at_eviction: list[tuple[int, int]] = []  # (spec.replicas, available replicas) when the eviction was sent

    async def on_evict(_: str) -> None:
        assert kube.deployment is not None
        at_eviction.append((kube.replicas, kube.deployment["status"]["availableReplicas"]))

    async def replacement_comes_up() -> None:
        await kube.written.wait()
        for _ in range(20):  # a few polls later
            await asyncio.sleep(0)
        kube.becomes_available()

    kube.on_evict = on_evict
    up = asyncio.create_task(replacement_comes_up())
    result = await drainer.drain(NODE, now[0] + 120, instance_end=now[0] + 120)
    await up
    assert result.completed
    assert kube.evicted == ["web-0"]
    assert at_eviction == [(2, 2)]
    assert (kube.replicas, kube.record) == (1, {})
    assert surges_counted(metrics) == {"surged": 1}


async def test_a_pod_its_budget_holds_keeps_its_replacement_until_the_drain_ends() -> None:
    """The eviction is refused until the drain's end (a PodDisruptionBudget that counts more than the surge):
    the replica stays while the drain lasts, and the drain takes it back as it ends."""
    kube, drainer, _, now = a_drain()
    kube.refuse_evictions = True
    replicas_at_attempts: list[int] = []

    async def on_evict(_: str) -> None:
        replicas_at_attempts.append(kube.replicas)
        kube.becomes_available()

    kube.on_evict = on_evict
    drainer.clock = lambda: now[0]

    bounds = fake_time_bounds(now, 60)
    result = await drainer.drain(NODE, bounds)
    assert not result.completed
    assert replicas_at_attempts
    assert set(replicas_at_attempts) == {2}
    assert (kube.replicas, kube.record) == (1, {})


async def test_a_lease_lost_while_waiting_leaves_the_surge_to_the_new_owner() -> None:
    from queue_processor.outcomes import ClaimLost

    kube, drainer, _, now = a_drain()
    lost = False

    async def guard() -> None:
        if lost:
            raise ClaimLost("node Lease held by another replica")

    async def lose_it() -> None:
        nonlocal lost
        await kube.written.wait()
        lost = True

    losing = asyncio.create_task(lose_it())
    with pytest.raises(ClaimLost):
        await drainer.drain(NODE, now[0] + 120, instance_end=now[0] + 120, guard=guard)
    await losing
    assert (kube.replicas, kube.record, kube.evicted) == (2, {"uid-web-0": "web-0"}, [])
    # the new owner's drain of the same pod takes the recorded surge over: no second replica
    kube.becomes_available()
    result = await drainer.drain(NODE, now[0] + 120, instance_end=now[0] + 120)
    assert result.completed
    assert (kube.replicas, kube.record) == (1, {})


async def test_a_replacement_that_is_not_available_in_time_does_not_keep_the_pod() -> None:
    """The surge waits until the pod's eviction must start for its grace period to end before the drain's end,
    then evicts anyway (the extra replica stays until the pod's eviction is accepted)."""
    kube, drainer, metrics, now = a_drain()

    replicas_at_eviction: list[int] = []
    evicted_at: list[float] = []

    async def on_evict(_: str) -> None:
        replicas_at_eviction.append(kube.replicas)
        evicted_at.append(now[0])

    kube.on_evict = on_evict
    bounds = fake_time_bounds(now, 60)
    result = await drainer.drain(NODE, bounds)
    assert result.completed
    assert replicas_at_eviction == [2]
    # it waited until the pod's 30 s grace and the 2 s pad were all that was left before the drain's end
    assert 100 + 60 - 30 - 2 <= evicted_at[0] <= 100 + 60 - 30, evicted_at
    assert (kube.replicas, kube.record) == (1, {})
    assert surges_counted(metrics) == {"not-ready": 1}


async def test_a_short_notice_evicts_without_a_surge() -> None:
    kube, drainer, metrics, now = a_drain()
    result = await drainer.drain(NODE, now[0] + 20, instance_end=now[0] + 20)  # 20 s: grace 10 s + pad + 10 s
    assert result.completed
    assert (kube.writes, kube.evicted) == (0, ["web-0"])
    assert surges_counted(metrics) == {"no-time": 1}


async def test_a_drain_cancelled_while_it_waits_takes_the_replica_back() -> None:
    kube, drainer, _, now = a_drain()
    drain = asyncio.create_task(drainer.drain(NODE, now[0] + 120, instance_end=now[0] + 120))
    await kube.written.wait()  # scaled up; waiting for the replacement
    drain.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drain
    assert (kube.replicas, kube.record, kube.evicted) == (1, {}, [])


async def test_on_the_emulation_which_serves_no_deployments_the_pod_is_evicted(tmp_path: Path) -> None:
    """A Deployment's pod as its ReplicaSet names and labels it; the Deployment answers 404 (``unavailable``)."""
    with KubeSandbox(SandboxClock(1.0)) as sandbox:
        sandbox.add_node("node-a")
        labels = {"app": "web", "pod-template-hash": "abc12"}
        (pod,) = sandbox.add_replicaset(
            "apps", "web-abc12", nodes=["node-a"], replicas=1, labels=labels, grace_s=1
        )
        kube = KubeClient(load_api_client(str(sandbox.kubeconfig(tmp_path / "kubeconfig"))))
        try:
            annotate = {"metadata": {"annotations": {DRAIN_POLICY_ANNOTATION: "surge"}}}
            await kube.request(
                "PATCH",
                f"/api/v1/namespaces/apps/pods/{pod}",
                body=annotate,
                content_type="application/merge-patch+json",
            )
            metrics = Metrics(process_metrics=False)
            drainer = Drainer(
                kube, DrainOptions(), budget=1, timing=DrainTiming(surge=True), observer=metrics
            )
            end = drainer.clock() + 60
            result = await drainer.drain("node-a", end, instance_end=end)
        finally:
            kube.close()
    assert result.completed
    assert result.evicted == 1
    assert surges_counted(metrics) == {"unavailable": 1}


async def test_a_lease_lost_under_the_handler_leaves_the_surge_to_the_new_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 47.3, through the wiring the controller runs: the handler guards the drain with the node Lease
    (``steps.lease_guard``), which cancels the drain when the Lease is lost. The surge is left recorded for the
    replica that owns the node now (before: the cancellation took the replica back, and the new owner evicted
    the Deployment's only pod with no replacement), and that replica's drain takes it over."""
    from tests.unit.test_handler import QUEUE, World, spot

    monkeypatch.setenv("QUEUE_URL", QUEUE)
    kube = Cluster(1)
    kube.add_node()
    kube.add_surge_pod("web-0")
    settings = load_settings(node_leases=True, surge_drains=True, drain_relist_after=0)  # lists once
    first = World(settings, leases=True, kube=kube)
    assert first.leases is not None
    operation = first.receive(spot())
    assert operation is not None
    running = asyncio.create_task(first.run(operation))
    await kube.written.wait()  # scaled up: the surge waits for the replacement
    first.leases.replica._end_epoch("the replica Lease lapsed (a paused process)")
    outcome, _ = await running
    assert outcome.value == "retry"
    assert first.count("queue_processor_operation_outcomes_total", outcome="lease-lost") == 1
    assert (kube.replicas, kube.record, kube.evicted) == (2, {"uid-web-0": "web-0"}, [])

    second = World(settings, leases=True, kube=kube, identity="replica-b")
    redelivered = second.receive(spot(receive_count=2))
    assert redelivered is not None
    kube.becomes_available()
    outcome, _ = await second.run(redelivered)
    assert outcome.value == "done"
    assert (kube.replicas, kube.record, kube.evicted) == (1, {}, ["web-0"])
    assert surges_counted(second.metrics) == {"surged": 1}


def owner_sets(kube: Cluster, replicas: int) -> None:
    """The Deployment's owner (a GitOps self-heal, ``kubectl scale``) sets its count; its controller catches up."""
    assert kube.deployment is not None
    kube.deployment["spec"]["replicas"] = replicas
    kube.deployment["metadata"]["generation"] += 1
    kube._bump(kube.deployment)
    kube.becomes_available()


async def test_an_owner_that_scales_the_surge_back_keeps_its_count_and_the_pod_waits_its_time() -> None:
    """Issue 47.4: once the owner sets the count back, ``availableReplicas`` equals ``spec.replicas`` again, but
    no replacement is coming: the pod is not evicted at once as if it had been (before: ``surged`` and evicted
    with no replacement), but when its eviction must start (``undone``), and the owner's count is kept."""
    kube, drainer, metrics, now = a_drain()

    def owner_scales_back() -> None:
        if kube.replicas == 2:
            owner_sets(kube, 1)  # while the surge waits for its replacement

    evicted_at: list[float] = []

    async def on_evict(_: str) -> None:
        evicted_at.append(now[0])

    kube.on_evict = on_evict
    bounds = fake_time_bounds(now, 60, owner_scales_back)
    with structlog.testing.capture_logs() as logs:
        result = await drainer.drain(NODE, bounds)
    assert result.completed
    assert 100 + 60 - 30 - 2 <= evicted_at[0] <= 100 + 60 - 30, evicted_at
    assert (kube.replicas, kube.record) == (1, {})
    assert surges_counted(metrics) == {"undone": 1}
    assert not [line for line in logs if line["event"] == "surge: scaled back down"]  # nothing was


async def test_a_take_back_never_lowers_a_count_the_owner_set_meanwhile() -> None:
    """Issue 47.8: the owner scales up during a surge (1 → 2 by the surge, then 10): the count is the owner's
    from then on, the surge is undone (the pod waits its time), and it ends at 10 (before: 9)."""
    kube, drainer, metrics, now = a_drain()

    def owner_scales_up() -> None:
        if kube.replicas == 2:
            owner_sets(kube, 10)

    bounds = fake_time_bounds(now, 60, owner_scales_up)
    result = await drainer.drain(NODE, bounds)
    assert result.completed
    assert (kube.replicas, kube.record, kube.evicted) == (10, {}, ["web-0"])
    assert surges_counted(metrics) == {"undone": 1}


async def test_a_record_left_behind_is_taken_back_only_while_the_count_is_still_ours() -> None:
    """Issue 47.8: a process killed mid-surge whose instance went before the redelivery leaves its record (base 1,
    the count 2 it wrote). Later the owner scales to 10; the next surge of the Deployment reads the owner's count
    as the new base: it ends at 10 (before: the stale entry's replica was taken back, 10 → 9)."""
    kube, drainer, _, now = a_drain()
    assert kube.deployment is not None
    kube.deployment["metadata"]["annotations"][SURGE_RECORD_ANNOTATION] = json.dumps(
        {"base": 1, "pods": {"uid-gone": "web-gone"}, "replicas": 2}
    )
    owner_sets(kube, 10)
    drain = asyncio.create_task(drainer.drain(NODE, now[0] + 120, instance_end=now[0] + 120))
    await kube.written.wait()
    assert (kube.replicas, kube.record) == (11, {"uid-web-0": "web-0"})
    kube.becomes_available()
    result = await drain
    assert result.completed
    assert (kube.replicas, kube.record) == (10, {})


async def test_a_surge_that_cannot_wait_for_min_ready_seconds_is_decided_before_any_write() -> None:
    kube, drainer, metrics, now = a_drain()
    assert kube.deployment is not None
    kube.deployment["spec"]["minReadySeconds"] = 300
    result = await drainer.drain(NODE, now[0] + 120, instance_end=now[0] + 120)
    assert result.completed
    assert (kube.writes, kube.evicted) == (0, ["web-0"])
    assert surges_counted(metrics) == {"no-time": 1}


async def test_a_surge_pod_is_evicted_before_the_nodes_last_pod_even_when_its_replacement_is_slow() -> None:
    """Issue 47.5: ``last`` means after every other pod of the node is gone. A surge pod whose replacement
    never comes waits no longer than its own wave's bound (before: the agent annotated ``last`` went when the
    first wave's wait ended, at about 90 s of a 120 s window, and the surge pod at about 113 s)."""
    kube, drainer, _, now = a_drain()
    kube.add_pod("agent")
    kube.pods[-1]["metadata"]["annotations"] = {DRAIN_POLICY_ANNOTATION: "last"}

    evicted_at: dict[str, float] = {}

    async def on_evict(name: str) -> None:
        evicted_at[name] = now[0]

    kube.on_evict = on_evict
    bounds = fake_time_bounds(now, 120)
    result = await drainer.drain(NODE, bounds)
    assert result.completed
    assert list(evicted_at) == ["web-0", "agent"], evicted_at  # in order of the evictions
    # its eviction started so that its 30 s grace and the 2 s pad ended by its wave's bound (188 s)
    assert evicted_at["web-0"] <= 100 + 120 - 30 - 2 - 30, evicted_at
    assert (kube.replicas, kube.record) == (1, {})
