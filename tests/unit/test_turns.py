"""Budgets for signals that leave time (issue 29, part 3): which events leave time, the limit of a group, the
turns a group's drains take, slots given back while waiting, and the handler waiting its turn."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queue_processor.aws import InstanceInfo
from queue_processor.events import RebalanceRecommendationEvent, ScheduledChangeEvent, SqsMessageRef
from queue_processor.leases import lease_name
from queue_processor.rules import leaves_time
from queue_processor.settlement import InFlightSlots
from queue_processor.turns import Turns, turn_limit
from tests.unit.test_handler import MANAGED, World, env, rebalance, settings, spot

__all__ = ["env"]  # the handler tests' fixture (the queue URL in the environment), used here too

NOW = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)


async def until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until ``predicate`` holds; fail after 4,000 turns (the fakes answer at once: this bounds
    a hang, it measures nothing)."""
    for _ in range(4000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never got there")


def scheduled(start_in_s: float) -> ScheduledChangeEvent:
    return ScheduledChangeEvent(
        instance_id="i-1",
        time=NOW,
        source_id=f"health-{start_in_s}",
        scheduled_start_time=NOW + timedelta(seconds=start_in_s),
    )


def test_rebalances_and_far_scheduled_changes_leave_time_nothing_else_does() -> None:
    rebalance_event = RebalanceRecommendationEvent(instance_id="i-1", time=NOW, source_id="r")
    assert leaves_time([rebalance_event], grace_period_s=120, wall=NOW)
    assert leaves_time([rebalance_event, scheduled(7 * 24 * 3600)], grace_period_s=120, wall=NOW)
    assert not leaves_time([scheduled(60)], grace_period_s=120, wall=NOW)  # due within a drain's time
    assert not leaves_time([rebalance_event, spot("m-1", "i-1")], grace_period_s=120, wall=NOW)
    assert not leaves_time([], grace_period_s=120, wall=NOW)


def test_a_limit_is_a_count_or_a_percentage_of_the_group_at_least_one() -> None:
    assert turn_limit("", 40) is None
    assert turn_limit("3", None) == 3
    assert turn_limit("10%", 45) == 4
    assert turn_limit("10%", 5) == 1
    assert turn_limit("100%", 7) == 7
    assert turn_limit("25%", None) == 1  # the group's size could not be read
    with pytest.raises(ValueError, match="percentage"):
        turn_limit("0%", 10)


async def test_a_group_runs_at_most_its_limit_in_arrival_order_and_urgent_ones_never_wait() -> None:
    turns = Turns()
    release = asyncio.Event()
    order: list[str] = []
    urgent = dict.fromkeys("abcde", False)
    joined = {name: asyncio.Event() for name in "abcde"}

    async def drain(name: str, group: str = "g") -> bool:
        async with turns.turn(group, 2, urgent=lambda: urgent[name], joined=joined[name]) as waited:
            order.append(name)
            await release.wait()
            return waited

    running = {name: asyncio.create_task(drain(name)) for name in "abcd"}
    other = asyncio.create_task(drain("e", group="h"))  # another group has turns of its own
    await until(lambda: len(order) == 3)
    assert order == ["a", "b", "e"]
    assert turns.waiting("g") == 2
    urgent["d"] = True  # a Spot warning joins d's operation
    joined["d"].set()
    await until(lambda: "d" in order)
    assert order == ["a", "b", "e", "d"]  # d goes before c, at once, though two run
    assert turns.running["g"] == 3
    release.set()
    results = await asyncio.gather(*running.values(), other)
    assert results == [False, False, True, True, False]
    assert order[-1] == "c"
    assert turns.running == {}
    assert turns.waiting("g") == 0


async def test_a_wait_cancelled_gives_its_place_up() -> None:
    turns = Turns()
    release = asyncio.Event()

    async def drain() -> None:
        async with turns.turn("g", 1, urgent=lambda: False, joined=asyncio.Event()):
            await release.wait()

    first = asyncio.create_task(drain())
    second = asyncio.create_task(drain())
    third = asyncio.create_task(drain())
    await until(lambda: turns.waiting("g") == 2)
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert turns.waiting("g") == 1
    release.set()
    await asyncio.gather(first, third)
    assert turns.running == {}


async def test_a_parked_message_gives_its_slot_back_once() -> None:
    slots = InFlightSlots(2)
    async with slots.reserve_room(2) as room:
        room.claim(SqsMessageRef(queue_url="q", message_id="m-1", receipt_handle="rh"))
    assert (slots.held, slots.free) == (1, 1)
    slots.park_message("m-1")
    slots.park_message("m-1")  # parked already: no second slot given back
    assert (slots.held, slots.free, slots.parked) == (0, 2, 1)
    assert slots.ref("m-1") is not None  # still held: renewed and settled with its receipt
    assert slots.release("m-1")
    assert (slots.held, slots.free, slots.parked) == (0, 2, 0)  # not given back twice


class Instances:
    """EC2 as the handler sees it: instance ``i-<n>`` has node ``node-<n>`` in the group ``workers``."""

    async def get(self, instance_id: str, *, fresh: bool = False) -> InstanceInfo | None:
        tags = {**MANAGED, "aws:autoscaling:groupName": "workers"}
        return InstanceInfo(instance_id, f"node-{instance_id[2:]}", "us-east-1a", "running", tags)


async def test_rebalance_drains_wait_their_turn_cordoned_and_a_spot_warning_starts_one_at_once(
    env: Any,
) -> None:
    world = World(settings(drain_budget_non_urgent="2"))
    world.handler.parts.resolver = Instances()  # type: ignore[assignment]
    world.kube.pods.clear()
    for index in range(4):
        world.kube.add_node(f"node-{index}")
        world.kube.add_pod(f"web-{index}", f"node-{index}")
    parked: list[str] = []
    world.handler.park_messages = parked.extend
    evicting: list[str] = []
    gate = asyncio.Event()

    async def held(name: str) -> None:
        evicting.append(name)
        await gate.wait()

    world.kube.on_evict = held
    operations = []
    for index in range(4):
        event = rebalance(f"m-{index}").model_copy(update={"instance_id": f"i-{index}"})
        operations.append(world.receive(event))
    runs = [asyncio.create_task(world.run(operation)) for operation in operations if operation is not None]
    await until(lambda: len(evicting) == 2 and world.handler.turns.waiting("workers") == 2)
    assert all(world.kube.nodes[f"node-{i}"]["spec"].get("unschedulable") for i in range(4))  # all cordoned
    assert set(parked) == {"m-2", "m-3"}  # the waiting ones gave their slots back
    again = rebalance("m-2-again").model_copy(
        update={"instance_id": "i-2", "source_id": "rebalance-m-2-again"}
    )
    assert world.receive(again) is None  # another message for i-2's waiting operation
    await until(lambda: "m-2-again" in parked)  # it gives its slot back too
    assert world.count("queue_processor_drains_waiting", group="workers") == 2
    joining = spot("m-spot", "i-3")
    assert world.receive(joining) is None  # joins i-3's waiting operation
    await until(lambda: len(evicting) == 3)
    assert evicting[-1] == "web-3"  # at once, ahead of i-2
    gate.set()
    outcomes = [outcome for outcome, _ in await asyncio.gather(*runs)]
    assert [str(o) for o in outcomes] == ["done"] * 4
    assert sorted(world.kube.evicted) == ["web-0", "web-1", "web-2", "web-3"]
    assert world.count("queue_processor_drains_waiting", group="workers") == 0
    await world.heartbeats.close()


async def test_a_scheduled_change_becoming_due_ends_the_wait() -> None:
    turns = Turns()
    release = asyncio.Event()
    due = [False]

    async def drain(name: str, urgent: list[bool]) -> None:
        async with turns.turn(
            "g", 1, urgent=lambda: urgent[0], joined=asyncio.Event(), recheck_s=lambda: 0.01
        ):
            await release.wait()

    first = asyncio.create_task(drain("first", [False]))
    second = asyncio.create_task(drain("second", due))
    await until(lambda: turns.waiting("g") == 1)
    due[0] = True  # nothing wakes it but the time it was told to look again
    await until(lambda: turns.running.get("g") == 2)
    release.set()
    await asyncio.gather(first, second)


async def _two_rebalance_drains_one_waiting(
    held: Callable[[str], Awaitable[None]],
) -> tuple[World, list[Any]]:
    """A group with a turn for one drain (NODE_LEASES on), two nodes of one pod each (``web-0``, ``web-1``),
    a rebalance recommendation for each, run until the second waits its turn; each eviction awaits
    ``held(pod)`` first. The world and the two runs (tasks)."""
    world = World(settings(drain_budget_non_urgent="1", node_leases=True), leases=True)
    world.handler.parts.resolver = Instances()  # type: ignore[assignment]
    world.kube.pods.clear()
    for index in range(2):
        world.kube.add_node(f"node-{index}")
        world.kube.add_pod(f"web-{index}", f"node-{index}")
    world.kube.on_evict = held
    runs = []
    for index in range(2):
        operation = world.receive(rebalance(f"m-{index}").model_copy(update={"instance_id": f"i-{index}"}))
        assert operation is not None
        runs.append(asyncio.create_task(world.run(operation)))
    await until(lambda: world.handler.turns.waiting("workers") == 1)
    return world, runs


async def test_a_waiting_drain_keeps_its_node_lease_and_a_warning_handed_over_ends_the_wait(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47.7: a drain waiting for its turn keeps its node Lease (before: given up, so that another
    replica's check for instances back in service could undo its cordon, and its turn later drained a node back
    in service without cordoning it again). A Spot warning another replica receives for that node is handed
    over on the Lease, joins, and starts the waiting drain at once."""
    monkeypatch.setattr("queue_processor.watch.UNWATCHED_POLL_S", 0.01)
    evicting: list[str] = []
    gate = asyncio.Event()

    async def held(name: str) -> None:
        evicting.append(name)
        await gate.wait()

    world, runs = await _two_rebalance_drains_one_waiting(held)
    assert world.leases is not None
    holder = world.leases.holder
    await until(lambda: len(evicting) == 1)
    await world.leases.flush()  # whatever was released is sent
    assert sorted(str(held) for held in _holders(world).values()) == [holder, holder]  # both kept
    waiting = "1" if evicting == ["web-0"] else "0"
    patch_lease = world.kube.patch_lease

    async def patched_and_watched(namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        lease = await patch_lease(namespace, name, patch)  # what the holder's Lease watch tells it
        assert world.leases is not None
        assert world.leases.watch.on_handed is not None
        world.leases.watch.on_handed(name, lease["metadata"]["annotations"])
        return lease

    world.kube.patch_lease = patched_and_watched  # type: ignore[method-assign]
    other = World(
        settings(drain_budget_non_urgent="1", node_leases=True),
        leases=True,
        kube=world.kube,
        identity="replica-b",
    )
    other.handler.parts.resolver = Instances()  # type: ignore[assignment]
    handed = other.receive(spot("m-spot", f"i-{waiting}"))
    assert handed is not None
    elsewhere = asyncio.create_task(other.run(handed))  # B cannot claim: it hands the warning over, and waits
    await until(lambda: len(evicting) == 2)
    assert evicting[-1] == f"web-{waiting}"  # the waiting drain started at once, the first still running
    gate.set()
    outcomes = [str(outcome) for outcome, _ in await asyncio.gather(*runs)]
    assert outcomes == ["done", "done"]
    assert str((await elsewhere)[0]) == "done"  # once A released the node, B finished its operation
    assert sorted(world.kube.evicted) == ["web-0", "web-1"]
    await other.heartbeats.close()
    await world.heartbeats.close()


async def test_a_lease_claimed_again_for_a_turn_and_lost_stops_the_drain_at_once(env: Any) -> None:
    """The drain kept its claim while it waited for its turn: losing it once the drain runs cancels the drain
    at once (the eviction in flight too), instead of being noticed at the drain's next confirm."""
    gates = {f"web-{index}": asyncio.Event() for index in range(2)}
    evicting: set[str] = set()

    async def held(name: str) -> None:
        evicting.add(name)
        await gates[name].wait()

    world, runs = await _two_rebalance_drains_one_waiting(held)
    gates["web-0"].set()  # the first drain ends; the second gets its turn, claims node-1 again, evicts web-1
    assert world.leases is not None
    replica = world.leases.replica
    await until(lambda: any(claim.name == lease_name("node-1") for claim in replica.claims))
    await until(lambda: "web-1" in evicting)
    for claim in [claim for claim in replica.claims if claim.name == lease_name("node-1")]:
        claim._mark_lost("another replica took the node")  # as the replica Lease's lapse does
    await until(runs[1].done)  # web-1's eviction is still held: only the guard can end the drain
    assert str(runs[1].result()[0]) == "retry"
    assert world.count("queue_processor_operation_outcomes_total", outcome="lease-lost") == 1
    assert str((await runs[0])[0]) == "done"
    await world.heartbeats.close()


def _holders(world: World) -> dict[str, Any]:
    return {  # the node Leases (not the replica's own)
        lease["metadata"]["name"]: lease["spec"].get("holderIdentity")
        for lease in world.kube.leases.values()
        if lease["metadata"]["name"].startswith("queue-processor-")
    }


async def test_a_group_size_that_cannot_be_read_counts_a_percentage_as_one(env: Any) -> None:
    world = World(settings(drain_budget_non_urgent="50%"))
    world.handler.parts.resolver = Instances()  # type: ignore[assignment]
    world.kube.pods.clear()
    world.kube.add_node("node-0")
    world.kube.add_pod("web-0", "node-0")
    operation = world.receive(rebalance("m-0").model_copy(update={"instance_id": "i-0"}))
    assert operation is not None
    outcome, _ = await world.run(operation)  # the fake Auto Scaling has no DescribeAutoScalingGroups
    assert str(outcome) == "done"
    assert world.kube.evicted == ["web-0"]
    await world.heartbeats.close()


async def test_a_hand_over_wakes_only_the_drain_whose_turn_it_is() -> None:
    """With a thousand drains waiting, waking every one at every hand-over cost O(n²): each woke, read its place
    in line and went back to sleep. Only the drain whose turn came looks again (each sleep is one ``waiting``)."""
    turns = Turns()
    sleeps: Counter[int] = Counter()
    order: list[int] = []
    release = {index: asyncio.Event() for index in range(-1, 10)}
    inside = asyncio.Event()

    async def drain(index: int) -> None:
        async def waiting() -> None:
            sleeps[index] += 1

        async with turns.turn(
            "g", 1, urgent=lambda: False, joined=asyncio.Event(), waiting=waiting if index >= 0 else None
        ):
            order.append(index)
            inside.set()
            await release[index].wait()

    running = [asyncio.create_task(drain(-1))]
    await inside.wait()
    for index in range(10):
        running.append(asyncio.create_task(drain(index)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert turns.waiting("g") == 10
    assert sum(sleeps.values()) == 10
    for index in range(-1, 9):
        release[index].set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert sum(sleeps.values()) == 10, sleeps  # nobody else went back to sleep: nobody else woke
    release[9].set()
    await asyncio.gather(*running)
    assert order == list(range(-1, 10))


async def test_a_labelled_group_is_sized_from_the_watched_nodes_not_a_list_per_drain(env: Any) -> None:
    """Issue 47.6: with DRAIN_BUDGET_GROUP_LABEL and a percentage, every drain that leaves time read its node and
    LISTed its whole group (a fleet-wide rebalance: O(N²) transfer, each list parsed on the event loop). The
    group and its size now come from the watched copy of the nodes: no node request at all."""
    from queue_processor.watch import NodeCache, slim

    world = World(settings(drain_budget_non_urgent="50%", drain_budget_group_label="pool"))
    world.handler.parts.resolver = Instances()  # type: ignore[assignment]
    world.kube.pods.clear()
    for index in range(4):
        world.kube.add_node(f"node-{index}", pool="blue")
        world.kube.add_pod(f"web-{index}", f"node-{index}")
    world.kube.add_node("node-other", pool="green")
    copy = NodeCache(world.kube)  # type: ignore[arg-type]
    for node in world.kube.nodes.values():
        copy._put(slim(node))
    copy._set_live(True)
    world.drainer.writes.nodes = copy
    requests: Counter[str] = Counter()
    get_node = world.kube.get_node

    async def counted_get(name: str) -> dict[str, Any] | None:
        requests["get nodes"] += 1
        return await get_node(name)

    async def counted_list(
        label_selector: str | None = None, *, cached: bool = False
    ) -> list[dict[str, Any]]:
        requests["list nodes"] += 1
        return [
            node for node in world.kube.nodes.values() if node["metadata"]["labels"].get("pool") == "blue"
        ]

    world.kube.get_node = counted_get  # type: ignore[method-assign]
    world.kube.list_nodes = counted_list  # type: ignore[attr-defined]
    gate = asyncio.Event()

    async def held(name: str) -> None:
        await gate.wait()

    world.kube.on_evict = held
    operations = [
        world.receive(rebalance(f"m-{index}").model_copy(update={"instance_id": f"i-{index}"}))
        for index in range(4)
    ]
    runs = [asyncio.create_task(world.run(operation)) for operation in operations if operation is not None]
    await until(lambda: world.handler.turns.waiting("pool=blue") == 2)  # 50 % of four nodes: two at a time
    assert requests["list nodes"] == 0
    gate.set()
    outcomes = [outcome for outcome, _ in await asyncio.gather(*runs)]
    assert [str(o) for o in outcomes] == ["done"] * 4
    assert requests == Counter()  # the cordons read the copy too
    await world.heartbeats.close()


async def test_a_turn_that_comes_after_the_instance_was_started_again_drains_nothing(env: Any) -> None:
    """Issue 47.7: when its turn comes, the waiting drain asks EC2 again whether its node still leaves. The
    instance was started again meanwhile (a later ``LaunchTime``): its node is not drained (before: drained,
    although back in service), and the check for instances back in service gives it back."""
    gate = asyncio.Event()

    async def held(name: str) -> None:
        await gate.wait()

    world, runs = await _two_rebalance_drains_one_waiting(held)
    waiting = world.handler.turns  # the second drain waits; which one depends on the loop's order
    assert waiting.waiting("workers") == 1

    class StartedAgain(Instances):
        async def get(self, instance_id: str, *, fresh: bool = False) -> InstanceInfo | None:
            info = await super().get(instance_id, fresh=fresh)
            if fresh and info is not None:
                later = datetime.now(UTC) + timedelta(minutes=1)  # EC2's LaunchTime: after every message
                info = InstanceInfo(
                    info.instance_id,
                    info.private_dns_name,
                    "us-east-1a",
                    "running",
                    info.tags,
                    launch_time=later,
                )
            return info

    world.handler.parts.resolver = StartedAgain()  # type: ignore[assignment]
    gate.set()
    outcomes = [str(outcome) for outcome, _ in await asyncio.gather(*runs)]
    assert outcomes == ["done", "done"]
    assert len(world.kube.evicted) == 1  # the first drain's pod only
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == 1
    await world.heartbeats.close()
