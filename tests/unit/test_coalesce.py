"""The event store: one operation per instance, every message settled, duplicates acknowledged."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queue_processor.events import (
    AdmissionKind,
    AsgLaunchLifecycleEvent,
    AsgTerminateLifecycleEvent,
    Event,
    EventStore,
    MessageOutcome,
    Mode,
    NodeOperation,
    RebalanceRecommendationEvent,
    SpotInterruptionEvent,
    SqsMessageRef,
    StateChangeEvent,
)

T0 = datetime(2026, 11, 22, 12, tzinfo=UTC)


def msg(message_id: str, handle: str = "rh") -> SqsMessageRef:
    return SqsMessageRef(queue_url="q", message_id=message_id, receipt_handle=f"{handle}-{message_id}")


def spot(instance: str, message: str, source: str = "s") -> SpotInterruptionEvent:
    return SpotInterruptionEvent(
        instance_id=instance, time=T0, source_id=f"{source}-{instance}", message=msg(message)
    )


def terminate(instance: str, message: str, token: str = "tok") -> AsgTerminateLifecycleEvent:
    return AsgTerminateLifecycleEvent(
        instance_id=instance,
        time=T0,
        auto_scaling_group_name="workers",
        lifecycle_hook_name="drain",
        lifecycle_action_token=f"{token}-{instance}",
        lifecycle_transition="autoscaling:EC2_INSTANCE_TERMINATING",
        message=msg(message),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_kind_for_one_instance_makes_one_drain_and_settles_every_message() -> None:
    store = EventStore()
    events: list[Event] = [
        RebalanceRecommendationEvent(instance_id="i-1", time=T0, source_id="r", message=msg("m1")),
        spot("i-1", "m2"),
        StateChangeEvent(instance_id="i-1", time=T0, source_id="sc", state="stopping", message=msg("m3")),
        terminate("i-1", "m4"),
        terminate("i-1", "m5", token="other"),
    ]
    admissions = [store.admit(event) for event in events]
    assert [a.kind for a in admissions] == [AdmissionKind.NEW] + [AdmissionKind.JOINED] * 4
    operation = admissions[0].operation
    assert operation is not None
    assert all(a.operation is operation for a in admissions)
    assert operation.mode is Mode.DRAIN
    assert len(operation.terminate_actions) == 2  # both lifecycle actions get completed
    for action in operation.unsettled():
        operation.settled[action.action_key] = "completed"
    settlement = store.finish(operation, succeeded=True)
    assert sorted(settlement) == [(f"m{n}", MessageOutcome.DELETE) for n in range(1, 6)]
    assert not store.running(operation)
    assert store.held() == []


def test_an_action_that_joined_after_the_last_completion_keeps_its_message() -> None:
    store = EventStore()
    operation = store.admit(spot("i-1", "m1")).operation
    assert operation is not None
    operation.joined.clear()
    late = terminate("i-1", "m2")
    assert store.admit(late).kind is AdmissionKind.JOINED
    assert operation.joined.is_set()  # the handler is told, no polling
    assert operation.unsettled() == [late]
    settlement = store.finish(operation, succeeded=True)  # the handler never completed it
    assert sorted(settlement) == [
        ("m1", MessageOutcome.DELETE),
        ("m2", MessageOutcome.REQUEUE),
    ]
    again = store.admit(terminate("i-1", "m2"))  # redelivered: a new operation completes it
    assert again.kind is AdmissionKind.NEW
    assert store.admit(spot("i-1", "m1")).kind is AdmissionKind.DONE  # the Spot warning was done


def test_a_redelivered_message_joins_and_then_is_done() -> None:
    store = EventStore()
    first = store.admit(spot("i-1", "m1"))
    again = store.admit(spot("i-1", "m1"))  # the same message, delivered again while in flight
    assert again.kind is AdmissionKind.JOINED
    assert first.operation is again.operation
    assert len(first.operation.events) == 1  # type: ignore[union-attr]
    settled = store.finish(first.operation, succeeded=True)  # type: ignore[arg-type]
    assert [outcome for _, outcome in settled] == [MessageOutcome.DELETE]
    later = store.admit(spot("i-1", "m1"))
    assert later.kind is AdmissionKind.DONE
    assert not store.in_flight("m1")


def test_a_failed_operation_requeues_its_messages_and_is_not_remembered() -> None:
    store = EventStore()
    operation = store.admit(spot("i-1", "m1")).operation
    store.admit(terminate("i-1", "m2"))
    settled = store.finish(operation, succeeded=False)  # type: ignore[arg-type]
    assert sorted(settled) == [
        ("m1", MessageOutcome.REQUEUE),
        ("m2", MessageOutcome.REQUEUE),
    ]
    assert store.admit(spot("i-1", "m1")).kind is AdmissionKind.NEW  # retried for real


def test_a_message_for_several_instances_settles_when_its_last_operation_ends() -> None:
    store = EventStore()
    shared = msg("health")
    a = store.admit(
        SpotInterruptionEvent(instance_id="i-a", time=T0, source_id="h", message=shared)
    ).operation
    b = store.admit(
        SpotInterruptionEvent(instance_id="i-b", time=T0, source_id="h", message=shared)
    ).operation
    assert a is not b
    assert store.finish(a, succeeded=True) == ()  # type: ignore[arg-type]
    assert store.in_flight("health")
    assert store.finish(b, succeeded=False) == (("health", MessageOutcome.REQUEUE),)  # type: ignore[arg-type]
    # When it comes back, the instance already drained is done; only the failed one is retried.
    assert store.admit(
        SpotInterruptionEvent(instance_id="i-a", time=T0, source_id="h", message=shared)
    ).kind is (AdmissionKind.DONE)
    assert store.admit(
        SpotInterruptionEvent(instance_id="i-b", time=T0, source_id="h", message=shared)
    ).kind is (AdmissionKind.NEW)


def test_launch_actions_get_their_own_operation() -> None:
    store = EventStore()
    launch = AsgLaunchLifecycleEvent(
        instance_id="i-1",
        time=T0,
        auto_scaling_group_name="workers",
        lifecycle_hook_name="launch",
        lifecycle_action_token="t",
        lifecycle_transition="autoscaling:EC2_INSTANCE_LAUNCHING",
        message=msg("m1"),
    )
    launching = store.admit(launch).operation
    draining = store.admit(spot("i-1", "m2")).operation
    assert launching is not draining
    assert (launching.mode, draining.mode) == (Mode.LAUNCH, Mode.DRAIN)  # type: ignore[union-attr]
    assert launching.launch_actions == [launch]  # type: ignore[union-attr]


def test_remembered_ids_expire() -> None:
    clock = Clock()
    store = EventStore(dedup_ttl_s=60, clock=clock)
    store.finish(store.admit(spot("i-1", "m1")).operation, succeeded=True)  # type: ignore[arg-type]
    clock.now = 59
    assert store.admit(spot("i-1", "m1")).kind is AdmissionKind.DONE
    clock.now = 61
    assert store.admit(spot("i-1", "m1")).kind is AdmissionKind.NEW


def test_finishing_an_unknown_operation_raises() -> None:
    store = EventStore()
    operation = store.admit(spot("i-1", "m1")).operation
    store.finish(operation, succeeded=True)  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        store.finish(operation, succeeded=True)  # type: ignore[arg-type]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["i-1", "i-2", "i-3"]), st.sampled_from(["m1", "m2", "m3", "m4"]), st.booleans()
        ),
        min_size=1,
        max_size=30,
    )
)
def test_every_admitted_message_is_settled_once_its_operations_end(
    steps: list[tuple[str, str, bool]],
) -> None:
    """Whatever arrives and however operations end: at most one operation per instance is in flight, a
    message is settled only after it was admitted (and not again until admitted again), and when every
    operation has ended no message is left unsettled."""
    store = EventStore()
    unsettled: set[str] = set()
    running: dict[tuple[str, Mode], NodeOperation] = {}

    def settle(messages: tuple[tuple[str, MessageOutcome], ...]) -> None:
        for message_id, _ in messages:
            assert message_id in unsettled
            unsettled.remove(message_id)

    for instance, message, succeed in steps:
        admission = store.admit(spot(instance, message, source=message))
        if admission.kind is AdmissionKind.DONE:
            continue
        unsettled.add(message)
        operation = admission.operation
        assert operation is not None
        assert running.setdefault(operation.key, operation) is operation  # one in flight per instance
        if succeed:  # end the operation now; otherwise leave it running
            settle(store.finish(operation, succeeded=True))
            del running[operation.key]
    for operation in running.values():
        settle(store.finish(operation, succeeded=False))
    assert not any(store.running(operation) for operation in running.values())
    assert store.held() == []
    assert unsettled == set()


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["i-1", "i-2"]),
            st.sampled_from(["m1", "m2", "m3"]),
            st.sampled_from(["spot", "terminate-a", "terminate-b"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=20,
    ),
    st.booleans(),
)
def test_a_message_is_deleted_only_when_every_action_it_carries_is_settled(
    steps: list[tuple[str, str, str, bool]], succeed: bool
) -> None:
    """Whatever the handler settled (each step says whether the action it brings gets completed), a
    message is deleted only if every lifecycle action it carries was settled and every operation it joined
    succeeded."""
    store = EventStore()
    carried: dict[str, set[object]] = {}
    operations: dict[tuple[str, Mode], NodeOperation] = {}
    settles: dict[object, bool] = {}
    for instance, message, kind, completes in steps:
        event: Event = (
            spot(instance, message, source=message)
            if kind == "spot"
            else terminate(instance, message, token=kind)
        )
        admission = store.admit(event)
        if admission.kind is AdmissionKind.DONE:
            continue
        assert admission.operation is not None
        operations[admission.operation.key] = admission.operation
        if isinstance(event, AsgTerminateLifecycleEvent):
            carried.setdefault(message, set()).add(event.action_key)
            settles[event.action_key] = settles.get(event.action_key, False) or completes
    deleted: set[str] = set()
    for operation in operations.values():
        for action in operation.lifecycle_actions:
            if settles[action.action_key]:
                operation.settled[action.action_key] = "completed"
        for message_id, outcome in store.finish(operation, succeeded=succeed):
            if outcome is MessageOutcome.DELETE:
                deleted.add(message_id)
    for message_id in deleted:
        assert succeed
        assert all(settles[key] for key in carried.get(message_id, set()))


def test_the_store_holds_each_message_until_every_operation_it_joined_has_ended() -> None:
    store = EventStore()
    first = spot("i-1", "m1")
    admitted = store.admit(first)
    assert admitted.operation is not None
    redelivered = first.model_copy(update={"message": msg("m1", handle="rh2")})  # received again
    assert store.admit(redelivered).kind is AdmissionKind.JOINED
    assert store.held() == ["m1"]  # once: its receipt handles are the settlement ledger's
    assert len(store.held()) == 1
    settlement = store.finish(admitted.operation, succeeded=True)
    assert settlement == (("m1", MessageOutcome.DELETE),)
    assert store.held() == []
