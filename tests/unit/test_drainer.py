"""The drainer with a small fake API server: how each pod's eviction ends (evicted, gone, refused by a
PodDisruptionBudget until the deadline, several budgets), what the drain result says, and what it reports."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import structlog.testing

from queue_processor.drain.drainer import WAVE_TIME_UP, Drainer
from queue_processor.drain.evictions import DrainRun, Running, Tell
from queue_processor.drain.plan import DrainBounds, DrainOptions, DrainOrder, DrainPod, DrainTiming, Eviction
from queue_processor.observe.events import POD_DELETED_AT_DEADLINE, POD_EVICTION
from queue_processor.observe.metrics import Metrics
from queue_processor.outcomes import DrainOutcome, EvictionOutcome, KubeError
from tests.unit.test_handler import NODE, FakeKube


def told(
    evicted: Callable[[str, str], Awaitable[None]] | None = None,
    deleted: Callable[[str, str], Awaitable[None]] | None = None,
    noticed: Callable[[str, str, str, str], Awaitable[None]] | None = None,
) -> Tell:
    """A drain's ``tell`` handing each pod Event to the callback of its kind."""

    async def tell(namespace: str, name: str, reason: str, message: str, *, warning: bool = False) -> None:
        if reason == POD_EVICTION[0]:
            assert not warning
            if evicted is not None:
                await evicted(namespace, name)
        elif reason == POD_DELETED_AT_DEADLINE[0]:
            assert warning
            if deleted is not None:
                await deleted(namespace, name)
        elif noticed is not None:
            assert warning
            await noticed(namespace, name, reason, message)

    return tell


class Answers(FakeKube):
    """Evictions answered per pod name: an HTTP status, or success when none is given."""

    def __init__(self, statuses: dict[str, int], deletions: dict[str, int] | None = None) -> None:
        super().__init__()
        self.statuses = statuses
        self.deletions = deletions or {}

    async def delete_pod(self, namespace: str, name: str, grace_s: int, uid: str | None = None) -> None:
        status = self.deletions.get(name)
        if status == 403:
            raise KubeError(
                403, "Forbidden", f'pods "{name}" is forbidden: User cannot delete resource "pods"'
            )
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]

    async def evict(
        self,
        namespace: str,
        name: str,
        grace_s: int | None = None,
        *,
        drain: str | None = None,
        taken: bool = False,
    ) -> None:
        status = self.statuses.get(name)
        if status == 404:
            self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
            raise KubeError(404, "NotFound", f'pods "{name}" not found')
        if status == 429:
            raise KubeError(
                429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
            )
        if status == 500:
            raise KubeError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )
        await super().evict(namespace, name, grace_s)


def world(statuses: dict[str, int]) -> tuple[Answers, Drainer, Metrics, list[float]]:
    kube = Answers(statuses)
    kube.add_node()
    for name in ("web-0", "web-1", "web-2", "web-3"):
        kube.add_pod(name)
    metrics = Metrics(process_metrics=False)
    now = [100.0]
    drainer = Drainer(kube, DrainOptions(), budget=2, observer=metrics, clock=lambda: now[0])  # type: ignore[arg-type]
    return kube, drainer, metrics, now


def evictions(metrics: Metrics, result: str) -> float:
    return metrics.registry.get_sample_value("queue_processor_evictions_total", {"result": result}) or 0.0


async def test_every_pod_evicted_is_a_complete_drain() -> None:
    kube, drainer, metrics, now = world({})
    result = await drainer.drain(NODE, deadline=now[0] + 60)
    assert (result.completed, result.outcome, result.evicted) == (True, DrainOutcome.DRAINED, 4)
    assert kube.pods == []
    assert evictions(metrics, "evicted") == 4
    assert metrics.registry.get_sample_value("queue_processor_draining_nodes") == 0  # back to none


async def test_each_eviction_ends_as_the_api_server_answers_it() -> None:
    # At the deadline (no time left for a retry): a 429 is a pod a PodDisruptionBudget kept, a 500 for several
    # budgets fails that pod, a 404 is a pod already gone.
    _, drainer, metrics, now = world({"web-0": 429, "web-1": 500, "web-2": 404})
    result = await drainer.drain(NODE, deadline=now[0])
    assert result.completed is False
    assert result.outcome is DrainOutcome.ERROR  # a failed pod outranks a blocked one
    assert (result.evicted, result.blocked) == (1, 1)
    assert [failure.split(":")[0] for failure in result.failed] == ["apps/web-1"]
    assert result.causes == [
        "a PodDisruptionBudget refuses the eviction of apps/web-0: Cannot evict pod as it would violate the "
        "pod's disruption budget.",
        "eviction of apps/web-1 failed: several PodDisruptionBudgets match it: This pod has more than one "
        "PodDisruptionBudget, which the eviction subresource does not support.",
    ]
    assert result.reason == "; ".join(result.causes)
    assert {result: evictions(metrics, result) for result in ("evicted", "gone", "pdb-blocked", "error")} == {
        "evicted": 1,
        "gone": 1,
        "pdb-blocked": 1,
        "error": 1,
    }


async def test_a_drain_held_by_a_pod_disruption_budget_times_out() -> None:
    kube, drainer, metrics, now = world(dict.fromkeys(("web-0", "web-1", "web-2", "web-3"), 429))
    result = await drainer.drain(NODE, deadline=now[0])
    assert (result.completed, result.outcome, result.blocked) == (False, DrainOutcome.TIMEOUT, 4)
    assert len(kube.pods) == 4
    assert evictions(metrics, "pdb-blocked") == 4


async def test_a_guard_that_raises_stops_the_drain_before_any_eviction() -> None:
    kube, drainer, _, now = world({})

    class LeaseLostError(Exception):
        pass

    async def guard() -> Any:
        raise LeaseLostError

    try:
        await drainer.drain(NODE, deadline=now[0] + 60, guard=guard)
    except LeaseLostError:
        pass
    else:
        raise AssertionError("the drain went on without its Lease")
    assert kube.evicted == []
    assert drainer.draining == 0


async def test_the_deadline_step_deletes_nothing_when_the_instance_ends_after_the_drain_deadline() -> None:
    # An AWS Health event's start next week: the drain still ends at its own deadline, nothing is deleted.
    kube = Answers({"web-0": 429})
    kube.add_node()
    kube.add_pod("web-0")
    now = [100.0]
    timing = DrainTiming(delete_at_deadline=True, delete_lead_s=5)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=timing, clock=lambda: now[0])  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=now[0], instance_end=now[0] + 7 * 86400)
    assert (result.completed, result.blocked, result.deleted_at_deadline) == (False, 1, 0)
    assert [p["metadata"]["name"] for p in kube.pods] == ["web-0"]


async def test_the_deadline_step_deletes_what_is_left_and_names_a_refused_deletion() -> None:
    # Both pods are held by a budget until the lead before the instance's end; web-0 is deleted, web-1's
    # deletion is refused (no RBAC rule for it): the drain is incomplete and says why.
    kube = Answers({"web-0": 429, "web-1": 429}, deletions={"web-1": 403})
    kube.add_node()
    kube.add_pod("web-0")
    kube.add_pod("web-1")
    now = [100.0]
    timing = DrainTiming(delete_at_deadline=True, delete_lead_s=5)
    drainer = Drainer(kube, DrainOptions(), budget=2, timing=timing, clock=lambda: now[0])  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=now[0] + 5, instance_end=now[0] + 5)
    assert (result.completed, result.deleted_at_deadline, result.remaining) == (False, 1, 1)
    assert [p["metadata"]["name"] for p in kube.pods] == ["web-1"]
    assert result.causes[-1].startswith("deletion of apps/web-1 at the deadline failed: ")
    assert "forbidden" in result.causes[-1]
    assert result.reason == "; ".join(result.causes)


async def test_an_unknown_drain_policy_is_reported_once_per_workload_and_the_pod_evicted() -> None:
    kube = Answers({})
    for node in ("node-a", "node-b"):
        kube.add_node(node)
    for name, node in (("web-0", "node-a"), ("web-1", "node-a"), ("web-2", "node-b"), ("db-0", "node-b")):
        kube.add_pod(name, node)
    for pod in kube.pods:
        value = "lats" if pod["metadata"]["name"].startswith("web") else "surge-please"
        pod["metadata"]["annotations"] = {"queue-processor/drain": value}
        if pod["metadata"]["name"].startswith("db"):
            pod["metadata"]["ownerReferences"][0]["name"] = "db"
    drainer = Drainer(kube, DrainOptions(), budget=2)  # type: ignore[arg-type]
    noticed: list[tuple[str, str, str]] = []

    async def notice(namespace: str, name: str, reason: str, message: str) -> None:
        assert reason == "UnknownDrainPolicy"
        noticed.append((namespace, name, message))

    for node in ("node-a", "node-b"):
        result = await drainer.drain(node, drainer.clock() + 60, tell=told(noticed=notice))
        assert result.completed
        assert result.waves == [2]  # evicted as by default, in the first wave
    assert sorted(kube.evicted) == ["db-0", "web-0", "web-1", "web-2"]
    assert [(namespace, name) for namespace, name, _ in noticed] == [("apps", "web-0"), ("apps", "db-0")]
    assert noticed[0][2] == (
        "queue-processor/drain: 'lats' is not a drain policy (evict, last, surge): "
        "the pods of apps/ReplicaSet/rs are evicted as by default"
    )


async def test_drains_at_once_keep_no_more_evictions_waiting_than_their_slots_and_the_first_goes_first() -> (
    None
):
    # A storm's drains start together: the pods not started yet wait as data, not as ten thousand suspended
    # requests; the node whose drain started first has its pods evicted first.
    kube = FakeKube()
    nodes = [f"ip-10-0-0-{index}.ec2.internal" for index in range(5)]
    for node in nodes:
        kube.add_node(node)
        for pod in range(4):
            kube.add_pod(f"{node}-pod-{pod}", node)
    waiting = [0, 0]  # now, most

    async def answer_later(name: str) -> None:
        waiting[0] += 1
        waiting[1] = max(waiting)
        for _ in range(3):
            await asyncio.sleep(0)
        waiting[0] -= 1

    kube.on_evict = answer_later
    now = [100.0]
    drainer = Drainer(kube, DrainOptions(), budget=5, clock=lambda: now[0], evictions_in_flight=6)  # type: ignore[arg-type]
    results = await asyncio.gather(*(drainer.drain(node, deadline=now[0] + 60) for node in nodes))
    assert [result.evicted for result in results] == [4] * 5
    assert waiting[1] == 6  # the slots were used, and never more
    assert [name.rsplit("-pod-", 1)[0] for name in kube.evicted[:4]] == [nodes[0]] * 4
    assert drainer.evictions.slots.free == 6


async def test_a_pod_a_budget_refuses_holds_no_slot_while_it_waits_to_retry() -> None:
    # One slot: the pod refused (429) waits for its retry without it, and the other pod is evicted meanwhile.
    kube = FakeKube()
    kube.add_node()
    kube.add_pod("web-0")
    kube.add_pod("web-1")
    refusals = {"web-0": 1}

    async def refuse_once(name: str) -> None:
        if refusals.get(name):
            refusals[name] -= 1
            raise KubeError(
                429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
            )

    kube.on_evict = refuse_once
    now = [100.0]
    drainer = Drainer(kube, DrainOptions(), budget=1, clock=lambda: now[0], evictions_in_flight=1)  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=now[0] + 60)
    assert (result.completed, result.evicted) == (True, 2)
    assert kube.evicted == ["web-1", "web-0"]  # web-1 did not wait behind web-0's retry
    assert drainer.evictions.slots.free == 1


async def test_a_drain_stopped_with_evictions_still_to_start_gives_every_slot_back() -> None:
    # Cancelled (the operation stops) while two evictions wait for their answer and four for a slot; and a
    # guard that raises (the Lease is lost) while evictions still wait for a slot ends the drain at once.
    kube = FakeKube()
    kube.add_node()
    for pod in range(6):
        kube.add_pod(f"web-{pod}")
    answered = asyncio.Event()

    async def never(name: str) -> None:
        await answered.wait()

    kube.on_evict = never
    now = [100.0]
    drainer = Drainer(kube, DrainOptions(), budget=1, clock=lambda: now[0], evictions_in_flight=2)  # type: ignore[arg-type]
    drain = asyncio.create_task(drainer.drain(NODE, deadline=now[0] + 60))
    for _ in range(10):
        await asyncio.sleep(0)
    assert drainer.evictions.slots.free == 0
    drain.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drain
    assert drainer.evictions.slots.free == 2
    assert kube.evicted == []

    class LeaseLostError(Exception):
        pass

    calls = [0]

    async def guard() -> None:
        calls[0] += 1
        if kube.evicted:  # lost once the first pod is evicted
            raise LeaseLostError

    kube.on_evict = None
    with pytest.raises(LeaseLostError):
        await drainer.drain(NODE, deadline=now[0] + 60, guard=guard)
    assert kube.evicted == ["web-0"]
    assert len(kube.pods) == 5  # the evictions still waiting for a slot were never started
    assert calls[0] < 6
    assert drainer.evictions.slots.free == 2


async def test_a_drain_waiting_for_its_lease_renewal_holds_no_slot() -> None:
    # One slot. The first drain's guard waits (its Lease renewal is due and in flight); the second drain's
    # pod is evicted meanwhile, and the first drain goes on once the renewal is answered.
    kube = FakeKube()
    for node in ("ip-a", "ip-b"):
        kube.add_node(node)
        kube.add_pod(f"{node}-web", node)
    renewed = asyncio.Event()
    calls = [0]

    async def renewal_due_once() -> None:
        calls[0] += 1
        if calls[0] == 1:
            await renewed.wait()

    now = [100.0]
    drainer = Drainer(kube, DrainOptions(), budget=2, clock=lambda: now[0], evictions_in_flight=1)  # type: ignore[arg-type]
    first = asyncio.create_task(drainer.drain("ip-a", deadline=now[0] + 60, guard=renewal_due_once))
    for _ in range(5):
        await asyncio.sleep(0)
    second = await drainer.drain("ip-b", deadline=now[0] + 60)
    assert second.evicted == 1
    assert not first.done()
    renewed.set()
    assert (await first).evicted == 1
    assert kube.evicted == ["ip-b-web", "ip-a-web"]
    assert drainer.evictions.slots.free == 1


async def test_a_wave_whose_wait_ended_keeps_its_place_ahead_of_the_next_in_the_line_of_slots() -> None:
    # Waves: the critical pod goes after the ordinary ones. The first wave's time runs out while its pods wait
    # for the one slot (another drain holds it): the critical pod still goes after them, not before.
    kube = FakeKube()
    kube.add_node("a")
    kube.add_node("b")
    for name in ("a-0", "a-1", "a-crit"):
        kube.add_pod(name, "a")
    kube.pods[-1]["spec"]["priorityClassName"] = "system-node-critical"
    kube.add_pod("b-0", "b")
    answered = asyncio.Event()

    async def hold_b(name: str) -> None:
        if name == "b-0":
            await answered.wait()

    kube.on_evict = hold_b
    lists: list[str] = []
    pods_on_node = kube.pods_on_node

    async def listed(node: str, *, cached: bool = False) -> list[dict[str, Any]]:
        lists.append(node)
        return await pods_on_node(node, cached=cached)

    kube.pods_on_node = listed  # type: ignore[method-assign]
    now = [100.0]
    timing = DrainTiming(order=DrainOrder("waves"), grace_margin_s=-1)
    drainer = Drainer(
        kube, DrainOptions(), budget=2, clock=lambda: now[0], timing=timing, evictions_in_flight=1
    )  # type: ignore[arg-type]
    second = asyncio.create_task(drainer.drain("b", deadline=now[0] + 600))
    for _ in range(20):
        await asyncio.sleep(0)
    first = asyncio.create_task(drainer.drain("a", deadline=now[0] + 600))
    for _ in range(20):
        await asyncio.sleep(0)
    now[0] += 590  # the first wave's bound passes
    looked = lists.count("a")
    for _ in range(1000):  # a hang guard: until the first wave's wait looked again (it polls, no watch here)
        if lists.count("a") > looked:
            break
        await asyncio.sleep(0.01)
    for _ in range(20):
        await asyncio.sleep(0)
    answered.set()
    await asyncio.gather(first, second)
    assert kube.evicted == ["b-0", "a-0", "a-1", "a-crit"]


async def test_a_wave_whose_time_is_up_names_the_pods_it_leaves_on_the_node() -> None:
    # The first wave's eviction is still unanswered when its time is up: the critical pod's wave starts and
    # its eviction may reach the API server first. The drain says so, naming the pod left behind: that is why
    # a pod that goes after every other of its node was not the last evicted there.
    kube = FakeKube()
    kube.add_node("a")
    kube.add_pod("a-0", "a")
    kube.add_pod("a-crit", "a")
    kube.pods[-1]["spec"]["priorityClassName"] = "system-node-critical"
    answered = asyncio.Event()

    async def hold(name: str) -> None:
        if name == "a-0":
            await answered.wait()

    kube.on_evict = hold
    now = [100.0]
    timing = DrainTiming(order=DrainOrder("waves"), grace_margin_s=-1)
    drainer = Drainer(kube, DrainOptions(), budget=2, clock=lambda: now[0], timing=timing)  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        drain = asyncio.create_task(drainer.drain("a", deadline=now[0] + 600))
        for _ in range(20):
            await asyncio.sleep(0)
        now[0] += 590  # the first wave's bound passes
        for _ in range(1000):  # a hang guard: until the critical pod's eviction was taken
            if "a-crit" in kube.evicted:
                break
            await asyncio.sleep(0.01)
        answered.set()
        await drain
    assert kube.evicted == ["a-crit", "a-0"]
    (line,) = [line for line in logs if line["event"] == WAVE_TIME_UP]
    assert (line["node"], line["pods"]) == ("a", ["apps/a-0"])


async def test_a_drain_that_settles_raises_an_eviction_that_failed_before_without_waiting_for_the_others() -> (
    None
):
    class LeaseLostError(Exception):
        pass

    async def lost() -> Any:
        raise LeaseLostError

    failed = asyncio.create_task(lost())
    await asyncio.sleep(0)
    never = asyncio.create_task(asyncio.Event().wait())
    running = Running([])
    running.add(failed)
    running.add(never)  # type: ignore[arg-type]
    settling = asyncio.create_task(running.settled())
    for _ in range(5):
        await asyncio.sleep(0)
    assert settling.done()
    with pytest.raises(LeaseLostError):
        settling.result()
    never.cancel()


async def test_an_eviction_that_ended_is_kept_as_its_outcome_and_its_task_let_go() -> None:
    """A storm's drains hold thousands of ended evictions until each drain ends: what is kept of one is its
    outcome, in the order the evictions started, not its task."""

    async def ended(name: str) -> Any:
        return Eviction(("ns", name), EvictionOutcome.EVICTED, "")

    release = asyncio.Event()

    async def later(name: str) -> Any:
        await release.wait()
        return Eviction(("ns", name), EvictionOutcome.EVICTED, "")

    running = Running([])
    first, second = asyncio.create_task(later("a")), asyncio.create_task(ended("b"))
    running.add(first)
    running.add(second)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert list(running) == [first]  # the ended one is no longer held as a task
    release.set()
    await running.settled()
    assert list(running) == []
    assert [outcome.key for outcome in running.outcomes()] == [("ns", "a"), ("ns", "b")]


class Budget(FakeKube):
    """Four pods of one ReplicaSet under a PodDisruptionBudget ``apps/web`` that allows no disruption: each
    eviction sent is recorded and refused with the budget named in its ``DisruptionBudget`` cause, as the API
    server answers. With ``hold``, each eviction waits for its token, as behind the client's rate limiter, until
    the test lets the first go (:attr:`first`), then the others (:attr:`rest`). ``others`` are pods of another
    ReplicaSet that no budget covers: their evictions are recorded and accepted."""

    def __init__(self, hold: bool = False, others: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.hold = hold
        self.others = others
        self.first, self.rest, self.all_in = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.refused = asyncio.Event()  # an eviction was sent (and refused)
        self.waiting = 0
        self.sent: list[str] = []
        if hold:
            self.limiter = self  # type: ignore[assignment]
        self.add_node()
        for name in ("web-0", "web-1", "web-2", "web-3", *others):
            self.add_pod(name)
            self.pods[-1]["metadata"]["ownerReferences"][0]["uid"] = (
                "rs-other-uid" if name in others else "rs-web-uid"
            )

    async def acquire(self, *, urgent: bool = False) -> None:
        self.waiting += 1
        if self.waiting == 4:
            self.all_in.set()
        await (self.first if self.waiting == 1 else self.rest).wait()

    def give_back(self) -> None:
        pass

    async def evict(
        self,
        namespace: str,
        name: str,
        grace_s: int | None = None,
        *,
        drain: str | None = None,
        taken: bool = False,
    ) -> None:
        self.sent.append(name)
        if name in self.others:
            await super().evict(namespace, name, grace_s, drain=drain)
            return
        self.refused.set()
        cause = {
            "reason": "DisruptionBudget",
            "message": "The disruption budget web needs 4 healthy pods and has 4 currently",
        }
        raise KubeError(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            causes=[cause],
        )

    async def get_pdb(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


async def test_a_budget_that_refused_a_pod_is_not_asked_for_the_other_pods_of_its_workload() -> None:
    # The first refusal closes the budget for the ReplicaSet's pods: the other three are not sent, and each
    # counts as held by the budget when the drain ends (the deadline is now: no reopening comes before it).
    kube = Budget()
    metrics = Metrics(process_metrics=False)
    drainer = Drainer(kube, DrainOptions(), budget=2, observer=metrics, clock=lambda: 100.0)  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=100.0)
    assert kube.sent == ["web-0"]
    assert (result.completed, result.outcome, result.blocked) == (False, DrainOutcome.TIMEOUT, 4)
    assert result.causes == [
        "PodDisruptionBudget apps/web refuses the eviction of apps/web-0, apps/web-1, apps/web-2, apps/web-3: "
        "Cannot evict pod as it would violate the pod's disruption budget."
    ]
    assert evictions(metrics, "pdb-blocked") == 4


async def test_an_eviction_waiting_for_its_turn_is_not_sent_once_its_budget_refused_another() -> None:
    # In a storm an eviction waits seconds for its token: the budget refused a pod of the same workload
    # meanwhile, and the eviction, asked again when its token comes, sends nothing.
    kube = Budget(hold=True)
    drainer = Drainer(kube, DrainOptions(), budget=2, clock=lambda: 100.0)  # type: ignore[arg-type]
    drain = asyncio.create_task(drainer.drain(NODE, deadline=100.0))
    await kube.all_in.wait()  # all four wait for their turn, none sent
    kube.first.set()
    await kube.refused.wait()
    await asyncio.sleep(0)  # the drain sees the refusal
    kube.rest.set()
    result = await drain
    assert kube.sent == ["web-0"]
    assert result.blocked == 4


async def test_a_pod_held_back_by_its_budgets_gate_gives_its_eviction_slot_up_while_it_waits() -> None:
    # One eviction slot: web-0's refusal closes the budget for web-1..3, which wait for its reopening without
    # their slot, so zz-0 (another workload, no budget) is evicted meanwhile rather than after their wait. On
    # the real clock (the gate's reopening is a second away); the order is asserted, not the time it takes.
    kube = Budget(others=("zz-0",))
    drainer = Drainer(kube, DrainOptions(), budget=2, evictions_in_flight=1)  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=time.monotonic() + 1.5)
    assert kube.sent[:2] == ["web-0", "zz-0"]  # web-1..3 held back by the gate hold no slot
    assert "zz-0" in kube.evicted
    assert (result.completed, result.blocked) == (False, 4)
    assert drainer.evictions.slots.free == 1


async def test_the_pods_a_budget_holds_back_wake_spread_over_a_fifth_of_its_closing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # web-0's refusal at 100 s closes the budget until 101 s (the first closing: 1 s). The pods it holds back
    # wake at the reopening plus up to a fifth of the closing, each at its own moment, so that they do not all
    # ask the budget at once. The clock moves only when a wait ends (a simulated clock: no real time passes).
    now = [100.0]
    wakes: list[float] = []

    async def sleep(self: DrainBounds, seconds: float, *, wake: asyncio.Event | None = None) -> bool:
        if now[0] == 100.0:
            wakes.append(now[0] + seconds)
        until = now[0] + max(seconds, 0.0)
        await asyncio.sleep(0)  # the others held at the same moment take their turn first
        now[0] = max(now[0], until)
        return False

    monkeypatch.setattr(DrainBounds, "sleep", sleep)
    kube = Budget()
    drainer = Drainer(kube, DrainOptions(), budget=2, clock=lambda: now[0])  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=103.0)
    assert len(wakes) >= 3, wakes  # web-1..3 (and web-0, for its retry)
    assert all(101.0 <= moment <= 101.2 for moment in wakes), wakes
    assert len(set(wakes)) == len(wakes)  # spread, not one instant
    assert kube.sent[0] == "web-0"
    assert result.blocked == 4


async def test_a_pod_whose_replacement_came_first_is_tried_once_whatever_its_budgets_gate_says() -> None:
    # A surge made room in the budget: its first attempt is sent even though the gate closed on its workload
    # (then refused here, it waits for the gate as any pod would).
    kube = Budget()
    drainer = Drainer(kube, DrainOptions(), budget=2, clock=lambda: 100.0)  # type: ignore[arg-type]
    drainer.evictions.gates.refused("rs-web-uid", "apps/web", "refused", 100.0)
    entry = DrainPod(key=("apps", "web-1"), uid="web-1", grace_s=30, evict=True, owner="rs-web-uid")
    bounds = DrainBounds(deadline=100.0)
    held = await drainer.evictions.evict_until(entry, DrainRun(bounds, "d"), past_gate=True)
    assert kube.sent == ["web-1"]
    assert held.result is EvictionOutcome.PDB_BLOCKED
    gated = await drainer.evictions.evict_until(entry, DrainRun(bounds, "d"))
    assert kube.sent == ["web-1"]  # not sent again: the gate is closed
    assert gated.result is EvictionOutcome.PDB_BLOCKED


class LateBinding(Answers):
    """A pod the scheduler bound to the node just before it saw the cordon: it shows up after the drain's first
    list of the node's pods."""

    def __init__(self, relisted: Callable[[], None] = lambda: None) -> None:
        super().__init__({})
        self.lists = 0
        self.relisted = relisted
        self.cached: list[bool] = []

    async def pods_on_node(self, node: str, *, cached: bool = False) -> list[dict[str, Any]]:
        pods = await super().pods_on_node(node, cached=cached)
        self.cached.append(cached)
        self.lists += 1
        if self.lists == 1:
            self.add_pod("late-0")
        elif self.lists == 2:
            self.relisted()
        return pods


@pytest.mark.parametrize("relist_s", [0.05, 0.0])
async def test_a_pod_bound_after_the_first_list_is_drained_when_the_drain_looks_again(
    relist_s: float,
) -> None:
    kube = LateBinding()
    kube.add_node()
    for name in ("web-0", "web-1"):
        kube.add_pod(name)
    now = [100.0]
    timing = DrainTiming(relist_s=relist_s)
    drainer = Drainer(kube, DrainOptions(), budget=2, timing=timing, clock=lambda: now[0])  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=now[0] + 60)
    names = [pod["metadata"]["name"] for pod in kube.pods]
    if relist_s:  # looked again: the late pod is evicted and waited for like the others
        assert (result.completed, result.evicted, names) == (True, 3, [])
        assert kube.cached.count(True) == 1  # the look again, from the API server's watch cache
    else:  # DRAIN_RELIST_AFTER=0: one list, as kubectl drain
        assert (result.completed, result.evicted, names) == (True, 2, ["late-0"])


async def test_a_late_pod_found_when_no_time_is_left_is_reported_left_not_waited_for() -> None:
    now = [100.0]
    kube = LateBinding(
        relisted=lambda: now.__setitem__(0, 101.0)
    )  # the deadline has passed at the second list
    kube.add_node()
    kube.statuses["late-0"] = 429  # its budget refuses it: still there at the deadline
    kube.add_pod("web-0")
    drainer = Drainer(kube, DrainOptions(), budget=2, timing=DrainTiming(relist_s=0.05), clock=lambda: now[0])  # type: ignore[arg-type]
    result = await drainer.drain(NODE, deadline=now[0] + 0.01)
    assert (result.completed, result.outcome, result.evicted, result.blocked) == (
        False,
        DrainOutcome.TIMEOUT,
        1,
        1,
    )
    assert result.remaining == 1
