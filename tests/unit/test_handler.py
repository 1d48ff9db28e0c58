"""The Handler with small fakes: one test per flag and per EarlyExit path, and the lifecycle-action
invariants (every action received is heartbeated until it is completed or over; no message is deleted while
an action it carries is open; heartbeat set-up never delays the cordon; no task outlives its operation).

The fakes keep Kubernetes' semantics where they matter here: ``spec.taints`` in a patch replaces the list
(it has no patch merge key), a patch with a stale ``resourceVersion`` answers 409, a Lease replaced with a
stale ``resourceVersion`` answers 409.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from botocore.exceptions import ClientError
from tenacity import AsyncRetrying, stop_after_attempt

from queue_processor import rest
from queue_processor.aws import InstanceInfo
from queue_processor.cli import load_settings
from queue_processor.config import Settings
from queue_processor.drain.drainer import Drainer
from queue_processor.drain.node_writes import CordonRecord
from queue_processor.drain.plan import DrainBounds, DrainOptions, DrainTiming
from queue_processor.events import (
    AdmissionKind,
    AsgLaunchLifecycleEvent,
    AsgTerminateLifecycleEvent,
    Event,
    EventStore,
    MessageOutcome,
    NodeOperation,
    RebalanceRecommendationEvent,
    ScheduledChangeEvent,
    SpotInterruptionEvent,
    SqsMessageRef,
    StateChangeEvent,
)
from queue_processor.handler import Handler
from queue_processor.leases import Claim, NodeLeases, lease_name
from queue_processor.lifecycle import Heartbeats, Lifecycle
from queue_processor.observe.metrics import Metrics
from queue_processor.observe.webhook import Webhook
from queue_processor.outcomes import KubeError
from queue_processor.rest import URGENT_RANK
from queue_processor.rules import RULES
from queue_processor.steps import EXCLUDE_FROM_LB_LABEL, OUT_OF_SERVICE_TAINT, Outcome
from queue_processor_gotemplate import Struct, parse
from queue_processor_sandbox.kube_logic import parse_label_selector

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/q"
INSTANCE = "i-0abc"
NODE = "ip-10-0-0-1.ec2.internal"
MANAGED = {"aws-node-termination-handler/managed": ""}


def ref(message_id: str, receive_count: int = 1) -> SqsMessageRef:
    return SqsMessageRef(
        queue_url=QUEUE,
        message_id=message_id,
        receipt_handle=f"rh-{message_id}",
        receive_count=receive_count,
    )


def spot(
    message_id: str = "m-spot", instance: str = INSTANCE, age_s: float = 0.0, receive_count: int = 1
) -> SpotInterruptionEvent:
    return SpotInterruptionEvent(
        instance_id=instance,
        time=datetime.now(UTC) - timedelta(seconds=age_s),
        source_id=f"spot-{message_id}",
        message=ref(message_id, receive_count),
    )


def rebalance(message_id: str = "m-rebalance") -> RebalanceRecommendationEvent:
    return RebalanceRecommendationEvent(
        instance_id=INSTANCE,
        time=datetime.now(UTC),
        source_id=f"rebalance-{message_id}",
        message=ref(message_id),
    )


def terminate(
    message_id: str = "m-asg",
    token: str = "tok-1",
    age_s: float = 0.0,
    instance: str = INSTANCE,
    receive_count: int = 1,
) -> AsgTerminateLifecycleEvent:
    return AsgTerminateLifecycleEvent(
        instance_id=instance,
        time=datetime.now(UTC) - timedelta(seconds=age_s),
        auto_scaling_group_name="workers",
        lifecycle_hook_name="drain",
        lifecycle_action_token=token,
        lifecycle_transition="autoscaling:EC2_INSTANCE_TERMINATING",
        message=ref(message_id, receive_count),
    )


def launch(destination: str = "AutoScalingGroup", age_s: float = 0.0) -> AsgLaunchLifecycleEvent:
    return AsgLaunchLifecycleEvent(
        instance_id=INSTANCE,
        time=datetime.now(UTC) - timedelta(seconds=age_s),
        auto_scaling_group_name="workers",
        lifecycle_hook_name="launch",
        lifecycle_action_token="tok-launch",
        lifecycle_transition="autoscaling:EC2_INSTANCE_LAUNCHING",
        destination=destination,
        message=ref("m-launch"),
    )


def client_error(code: str, message: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "Operation")


class FakeAutoscaling:
    """Auto Scaling's lifecycle API for one hook: open actions by token, calls recorded in order."""

    def __init__(
        self, heartbeat_timeout_s: int = 300, *, deny_describe: bool = False, default_result: str = "ABANDON"
    ) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.deny_describe = deny_describe
        self.default_result = default_result
        self.results: dict[str, str] = {}  # token → LifecycleActionResult of its completion
        self.open: set[str] = set()
        self.calls: list[tuple[str, str]] = []  # (operation, token)
        self.fail_heartbeats = 0  # the next N heartbeats are throttled
        self.complete_gate: asyncio.Event | None = None  # completions wait for it when set
        self.on_complete: Callable[[str], None] | None = None  # called with the token of each completion
        self.waiting: dict[
            str, str
        ] = {}  # instance ID → LifecycleState of a wait (DescribeAutoScalingInstances)

    async def describe_lifecycle_hooks(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("DescribeLifecycleHooks", ""))
        if self.deny_describe:
            raise client_error(
                "AccessDenied", "not authorized to perform: autoscaling:DescribeLifecycleHooks"
            )
        hook = {"HeartbeatTimeout": self.heartbeat_timeout_s, "DefaultResult": self.default_result}
        return {"LifecycleHooks": [hook]}

    async def record_lifecycle_action_heartbeat(self, **kwargs: Any) -> dict[str, Any]:
        token = kwargs.get("LifecycleActionToken", "")
        if self.fail_heartbeats > 0:
            self.fail_heartbeats -= 1
            self.calls.append(("RecordLifecycleActionHeartbeat:Throttling", token))
            raise client_error("Throttling", "Rate exceeded")
        if token not in self.open:
            self.calls.append(("RecordLifecycleActionHeartbeat:ValidationError", token))
            raise client_error("ValidationError", f"No active Lifecycle Action found with token {token}")
        self.calls.append(("RecordLifecycleActionHeartbeat", token))
        return {}

    async def describe_auto_scaling_instances(self, **kwargs: Any) -> dict[str, Any]:
        """Each instance's LifecycleState as ``self.waiting`` gives it; refused (AccessDenied, as NTH's policy
        without it would be) for an instance it does not name."""
        self.calls.append(("DescribeAutoScalingInstances", ""))
        if not all(instance in self.waiting for instance in kwargs["InstanceIds"]):
            raise client_error(
                "AccessDenied", "not authorized to perform: autoscaling:DescribeAutoScalingInstances"
            )
        return {
            "AutoScalingInstances": [
                {"InstanceId": instance, "LifecycleState": self.waiting[instance]}
                for instance in kwargs["InstanceIds"]
            ]
        }

    async def complete_lifecycle_action(self, **kwargs: Any) -> dict[str, Any]:
        if self.complete_gate is not None:
            await self.complete_gate.wait()
        token = kwargs.get("LifecycleActionToken", "")
        if token not in self.open:
            raise client_error("ValidationError", f"No active Lifecycle Action found with token {token}")
        self.open.discard(token)
        self.calls.append(("CompleteLifecycleAction", token))
        self.results[token] = kwargs["LifecycleActionResult"]
        if self.on_complete is not None:
            self.on_complete(token)
        return {}

    def made(self, operation: str) -> list[str]:
        return [token for op, token in self.calls if op == operation]


class Tokens:
    """The client's rate limiter as the fakes need it: a token at once; :attr:`taken` counts them, less those given
    back."""

    def __init__(self) -> None:
        self.taken = 0

    async def acquire(self, *, urgent: bool = False) -> None:
        self.taken += 1

    def give_back(self) -> None:
        self.taken -= 1


class FakeKube:
    """Nodes, pods and Leases with the API server's answers this test needs."""

    def __init__(self) -> None:
        self.version = 0
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.leases: dict[str, dict[str, Any]] = {}
        self.evicted: list[str] = []
        self.deleted: list[str] = []  # deleted at the deadline (DELETE_AT_DEADLINE)
        self.refuse_evictions = False  # 429 from a PodDisruptionBudget
        self.on_evict: Any = None
        self.limiter = Tokens()

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def add_node(
        self, name: str = NODE, *, taints: list[dict[str, str]] | None = None, **labels: str
    ) -> None:
        node = {"metadata": {"name": name, "labels": dict(labels)}, "spec": {"taints": taints or []}}
        self._bump(node)
        self.nodes[name] = node

    def add_pod(self, name: str, node: str = NODE) -> None:
        owner = [{"kind": "ReplicaSet", "name": "rs", "controller": True}]
        self.pods.append(
            {
                "metadata": {"name": name, "namespace": "apps", "uid": name, "ownerReferences": owner},
                "spec": {"nodeName": node},
                "status": {"phase": "Running"},
            }
        )

    async def get_node(self, name: str) -> dict[str, Any] | None:
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node is not None else None

    async def patch_node(self, name: str, patch: Any, patch_type: str = "strategic") -> dict[str, Any]:
        node = self.nodes.get(name)
        if node is None:
            raise KubeError(404, "NotFound", f'nodes "{name}" not found')
        meta = patch.get("metadata") or {}
        if "resourceVersion" in meta and meta["resourceVersion"] != node["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        node["metadata"]["labels"].update(meta.get("labels") or {})
        annotations = node["metadata"].setdefault("annotations", {})
        for key, value in (meta.get("annotations") or {}).items():  # a merge patch: null removes
            annotations.pop(key, None) if value is None else annotations.__setitem__(key, value)
        node["spec"].update(patch.get("spec") or {})  # taints: the whole list is replaced
        self._bump(node)
        return copy.deepcopy(node)

    async def pods_on_node(self, node: str, *, cached: bool = False) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods if p["spec"]["nodeName"] == node]

    async def evict(
        self,
        namespace: str,
        name: str,
        grace_s: int | None = None,
        *,
        drain: str | None = None,
        taken: bool = False,
    ) -> None:
        if self.on_evict is not None:
            await self.on_evict(name)
        if self.refuse_evictions:
            raise KubeError(
                429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
            )
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
        self.evicted.append(name)

    async def delete_pod(
        self, namespace: str, name: str, grace_s: int = 0, *, uid: str | None = None
    ) -> None:
        if not any(p["metadata"]["name"] == name for p in self.pods):
            raise KubeError(404, "NotFound", f'pods "{name}" not found')
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
        self.deleted.append(name)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        lease = self.leases.get(name)
        return copy.deepcopy(lease) if lease is not None else None

    async def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        name = lease["metadata"]["name"]
        if name in self.leases:
            raise KubeError(409, "AlreadyExists", "exists")
        lease = copy.deepcopy(lease)
        self._bump(lease)
        self.leases[name] = lease
        return copy.deepcopy(lease)

    async def replace_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        name = lease["metadata"]["name"]
        current = self.leases.get(name)
        if current is None or current["metadata"]["resourceVersion"] != lease["metadata"].get(
            "resourceVersion"
        ):
            raise KubeError(409, "Conflict", "the object has been modified")
        lease = copy.deepcopy(lease)
        self._bump(lease)
        self.leases[name] = lease
        return copy.deepcopy(lease)

    async def patch_lease(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        lease = self.leases.get(name)
        if lease is None:
            raise KubeError(404, "NotFound", f'leases "{name}" not found')
        annotations = lease["metadata"].setdefault("annotations", {})
        annotations.update(patch["metadata"]["annotations"])
        self._bump(lease)
        return copy.deepcopy(lease)

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str | None = None) -> None:
        current = self.leases.get(name)
        if current is None:
            return
        if resource_version is not None and current["metadata"]["resourceVersion"] != resource_version:
            raise KubeError(409, "Conflict", "Precondition failed: ResourceVersion in precondition")
        del self.leases[name]

    def retrying(self) -> AsyncRetrying:
        return AsyncRetrying(stop=stop_after_attempt(1), reraise=True)  # the fake answers once

    async def delete_leases(self, namespace: str, label_selector: str, **kwargs: Any) -> list[str]:
        selects = parse_label_selector(label_selector)
        deleted = [
            name for name, lease in self.leases.items() if selects(lease["metadata"].get("labels") or {})
        ]
        for name in deleted:
            del self.leases[name]
        return deleted


class FakeResolver:
    """``info`` from the cache; ``fresh_info`` (when set) is what a fresh read finds: EC2 has changed since."""

    def __init__(self, info: InstanceInfo | None) -> None:
        self.info = info
        self.fresh_info: InstanceInfo | None = None
        self.fresh_reads = 0
        self.on_fresh: Callable[[], object] | None = None  # what happens meanwhile, while EC2 answers

    async def get(self, instance_id: str, *, fresh: bool = False) -> InstanceInfo | None:
        if fresh:
            self.fresh_reads += 1
            if self.on_fresh is not None:
                self.on_fresh()
            if self.fresh_info is not None:
                return self.fresh_info
        return self.info


class FakeFinder:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube

    async def find(self, info: InstanceInfo) -> dict[str, Any] | None:
        return await self.kube.get_node(info.private_dns_name)


class World:
    """A Handler wired to the fakes, and the event store the consumer would use."""

    def __init__(
        self,
        settings: Settings,
        *,
        autoscaling: FakeAutoscaling | None = None,
        leases: bool = False,
        kube: FakeKube | None = None,
        identity: str = "replica-a",
    ):
        self.settings = settings
        fresh = kube is None
        self.kube = kube if kube is not None else FakeKube()
        self.autoscaling = autoscaling or FakeAutoscaling()
        self.info: InstanceInfo | None = InstanceInfo(INSTANCE, NODE, "us-east-1a", "running", dict(MANAGED))
        self.resolver = FakeResolver(self.info)
        self.metrics = Metrics(process_metrics=False)
        self.lifecycle = Lifecycle(self.autoscaling, settings, observer=self.metrics)
        self.heartbeats = Heartbeats(self.lifecycle)
        self.drainer = Drainer(
            self.kube,  # type: ignore[arg-type]
            DrainOptions(),
            budget=10,
            timing=DrainTiming.of(settings),
            observer=self.metrics,
        )
        self.leases = (
            NodeLeases(self.kube, namespace="ops", identity=identity, duration_s=60)  # type: ignore[arg-type]
            if leases
            else None
        )
        self.handler = Handler(
            settings,
            resolver=self.resolver,  # type: ignore[arg-type]
            finder=FakeFinder(self.kube),  # type: ignore[arg-type]
            heartbeats=self.heartbeats,
            drainer=self.drainer,
            leases=self.leases,
            observer=self.metrics,
        )
        self.store = EventStore()
        if fresh:  # a kube given is another replica's cluster, or one the test built
            self.kube.add_node()
            for index in range(3):
                self.kube.add_pod(f"web-{index}")

    def receive(self, event: Event) -> NodeOperation | None:
        """What the consumer does on receipt: admit, start heartbeats; the new operation, if any."""
        if isinstance(event, AsgTerminateLifecycleEvent | AsgLaunchLifecycleEvent):
            self.autoscaling.open.add(event.lifecycle_action_token or "")
        admission = self.store.admit(event)
        if admission.kind is not AdmissionKind.DONE:
            self.handler.received(event)
        return admission.operation if admission.kind is AdmissionKind.NEW else None

    async def run(self, operation: NodeOperation) -> tuple[Outcome, dict[str, MessageOutcome]]:
        """Handle ``operation`` and settle its messages; the node Lease released is sent at once (it waits for
        others' otherwise: tests/sandbox/test_leases.py)."""
        outcome = await self.handler.handle(operation)
        if self.leases is not None:
            await self.leases.flush()
        settlement = self.store.finish(operation, succeeded=outcome is Outcome.DONE)
        return outcome, dict(settlement)

    def count(self, name: str, **labels: str) -> float:
        """A sample of the metrics the handler reported (0 when absent)."""
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def node(self) -> dict[str, Any]:
        return self.kube.nodes[NODE]

    def taint_keys(self) -> set[str]:
        return {t["key"] for t in self.node()["spec"].get("taints") or []}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    return monkeypatch


async def until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until ``predicate`` holds (the fakes answer at once: no time is measured)."""
    while not predicate():  # noqa: ASYNC110 - the state polled is the fakes', which have no event
        await asyncio.sleep(0.005)


def settings(**overrides: Any) -> Settings:
    """The controller's settings with ``overrides``; a drain lists the node's pods once (DRAIN_RELIST_AFTER=0,
    as kubectl drain: the look again is tests/unit/test_drainer.py's, and its wait here would be seconds of
    wall time per drain)."""
    return load_settings(**{"drain_relist_after": 0, **overrides})


def our_tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current}


# ------------------------------------------------------------------------------------------ the happy path


async def test_a_terminate_action_is_drained_then_completed_and_its_message_deleted(env: Any) -> None:
    world = World(settings())
    operation = world.receive(terminate())
    assert operation is not None
    assert world.heartbeats.running == 1  # the action's heartbeat, from receipt on
    outcome, messages = await world.run(operation)
    assert outcome is Outcome.DONE
    assert messages == {"m-asg": MessageOutcome.DELETE}
    assert world.node()["spec"]["unschedulable"] is True
    assert sorted(world.kube.evicted) == ["web-0", "web-1", "web-2"]
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert world.heartbeats.running == 0
    assert our_tasks() == set()  # nothing the operation started outlives it
    # What a dashboard shows of it.
    assert world.count("queue_processor_evictions_total", result="evicted") == 3
    assert world.count("queue_processor_lifecycle_completions_total", result="continue") == 1
    # NTH's actions_total as NTH counts them: no "cordon" outside CORDON_ONLY, PreDrain and PostDrain once
    nth = {
        action: world.count("actions_total", node_action=action, node_status="success")
        for action in ("pre-drain", "cordon", "cordon-and-drain", "post-drain")
    }
    assert nth == {"pre-drain": 1, "cordon": 0, "cordon-and-drain": 1, "post-drain": 1}
    ours = "queue_processor_node_actions_total"
    assert world.count(ours, node_action="lifecycle-complete", node_status="success") == 1
    drains = "queue_processor_drain_duration_seconds_count"
    assert world.count(drains, kind="asg-terminate-lifecycle", result="drained") == 1
    assert world.count("queue_processor_event_to_cordon_seconds_count") == 1


# --------------------------------------------------------------------------------------------- the flags


async def test_dry_run_changes_nothing_in_kubernetes_and_still_completes_the_action(env: Any) -> None:
    """NTH's DRY_RUN: the instance is not held until its hook times out."""
    world = World(settings(dry_run=True))
    operation = world.receive(terminate())
    assert operation is not None
    assert world.heartbeats.running == 0  # no heartbeat in a dry run
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert "unschedulable" not in world.node()["spec"]
    assert world.kube.evicted == []
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert world.count("actions_total", node_action="post-drain", node_status="success") == 1


async def test_cordon_only_cordons_and_completes_without_a_drain_or_the_lb_label(env: Any) -> None:
    world = World(settings(cordon_only=True, exclude_from_load_balancers=True))
    operation = world.receive(terminate())
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.node()["spec"]["unschedulable"] is True
    assert world.kube.evicted == []
    assert EXCLUDE_FROM_LB_LABEL[0] not in world.node()["metadata"]["labels"]  # NTH: CordonAndDrain only
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    counted = {
        action: world.count("actions_total", node_action=action, node_status="success")
        for action in ("cordon", "cordon-and-drain", "post-drain")
    }
    assert counted == {"cordon": 1, "cordon-and-drain": 0, "post-drain": 1}


async def test_the_lb_label_never_overwrites_a_value_already_there(env: Any) -> None:
    world = World(settings(exclude_from_load_balancers=True))
    world.kube.nodes[NODE]["metadata"]["labels"][EXCLUDE_FROM_LB_LABEL[0]] = "maintenance"
    operation = world.receive(spot())
    assert operation is not None
    await world.run(operation)
    assert world.node()["metadata"]["labels"][EXCLUDE_FROM_LB_LABEL[0]] == "maintenance"


async def test_exclude_from_load_balancers_labels_the_node(env: Any) -> None:
    world = World(settings(exclude_from_load_balancers=True))
    operation = world.receive(spot())
    assert operation is not None
    await world.run(operation)
    assert world.node()["metadata"]["labels"][EXCLUDE_FROM_LB_LABEL[0]] == EXCLUDE_FROM_LB_LABEL[1]


async def test_taint_node_keeps_other_taints_and_taints_kinds_that_join_during_the_drain(env: Any) -> None:
    world = World(settings(taint_node=True))
    world.kube.nodes[NODE]["spec"]["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    operation = world.receive(spot())
    assert operation is not None

    async def join_once(name: str) -> None:
        if name == "web-0":
            world.receive(terminate())  # the ASG terminate action arrives mid-drain
            await asyncio.sleep(0)  # let the taint watcher see it

    world.kube.on_evict = join_once
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.taint_keys() == {
        "dedicated",
        RULES[operation.first.kind].taint_key,
        RULES[terminate().kind].taint_key,
    }
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]


async def test_out_of_service_taint_after_the_drain_keeps_the_others(env: Any) -> None:
    world = World(settings(enable_out_of_service_taint=True, taint_node=True))
    operation = world.receive(spot())
    assert operation is not None
    await world.run(operation)
    assert world.taint_keys() == {OUT_OF_SERVICE_TAINT[0], RULES[operation.first.kind].taint_key}


async def test_use_provider_id_finds_the_node_before_cordoning(env: Any) -> None:
    world = World(settings(use_provider_id=True))
    operation = world.receive(spot())
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.node()["spec"]["unschedulable"] is True


@pytest.mark.parametrize("delete_if_not_found", [True, False])
async def test_no_node(env: Any, delete_if_not_found: bool) -> None:
    world = World(settings(delete_sqs_msg_if_node_not_found=delete_if_not_found, use_provider_id=True))
    del world.kube.nodes[NODE]
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert outcome is (Outcome.DONE if delete_if_not_found else Outcome.RETRY)
    if delete_if_not_found:  # acknowledged, and its lifecycle action completed so the instance goes
        assert messages == {"m-asg": MessageOutcome.DELETE}
        assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    else:  # EarlyExit: requeued, still heartbeated
        assert messages == {"m-asg": MessageOutcome.REQUEUE}
        assert world.heartbeats.running == 1
    await world.heartbeats.close()


async def test_the_cordon_404_falls_back_to_the_hostname_lookup_then_requeues(env: Any) -> None:
    world = World(settings())
    del world.kube.nodes[NODE]
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.RETRY, {"m-asg": MessageOutcome.REQUEUE})
    assert world.autoscaling.made("CompleteLifecycleAction") == []
    await world.heartbeats.close()


async def test_an_unmanaged_instance_is_left_alone_and_not_heartbeated(env: Any) -> None:
    world = World(settings())
    world.resolver.info = InstanceInfo(INSTANCE, NODE, "us-east-1a", "running", {})
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert "unschedulable" not in world.node()["spec"]
    assert world.heartbeats.running == 0
    assert world.count("queue_processor_operation_outcomes_total", outcome="unmanaged") == 1


def stopped(message_id: str = "m-stop", state: str = "stopping") -> StateChangeEvent:
    return StateChangeEvent(
        instance_id=INSTANCE, time=datetime.now(UTC), state=state, message=ref(message_id)
    )


@pytest.mark.parametrize(
    ("now", "drained"), [("running", False), ("pending", False), ("stopping", True), ("stopped", True)]
)
async def test_a_stop_is_drained_unless_the_instance_has_started_again(
    env: Any, now: str, drained: bool
) -> None:
    """A warm pool stops an instance and later starts it into the group: a ``stopping`` message still in the
    queue then must not cordon the node the restarted instance registered."""
    world = World(settings())
    world.resolver.info = InstanceInfo(INSTANCE, NODE, "us-east-1a", now, dict(MANAGED))
    operation = world.receive(stopped())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-stop": MessageOutcome.DELETE})
    assert bool(world.node()["spec"].get("unschedulable")) is drained
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == (not drained)
    # a state change has no PreDrain in NTH
    assert world.count("actions_total", node_action="pre-drain", node_status="success") == 0
    assert world.count("actions_total", node_action="cordon-and-drain", node_status="success") == drained


@pytest.mark.parametrize(("launched_s", "drained"), [(0, False), (-1, True), (-3600, True)])
async def test_a_stop_sent_in_the_second_of_the_start_is_over(
    env: Any, launched_s: int, drained: bool
) -> None:
    """EC2 reports ``LaunchTime`` to the second: a start in the same second as the stop's message looks no later
    than it (a warm pool's stop and return, compressed in the sandbox: 1 of 3 warm-pool nodes left cordoned in
    ``make versus-nth``). A ``running`` instance whose ``LaunchTime`` is a second or more before the stop
    (EC2's eventual consistency just after a stop) is still drained."""
    world = World(settings())
    event = stopped()
    second = event.time.replace(microsecond=0) + timedelta(seconds=launched_s)
    world.resolver.info = InstanceInfo(
        INSTANCE, NODE, "us-east-1a", "running", dict(MANAGED), launch_time=second
    )
    operation = world.receive(event)
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert bool(world.node()["spec"].get("unschedulable")) is drained
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == (not drained)


def launched(age_s: float) -> InstanceInfo:
    """The managed instance, running, last launched or started ``age_s`` seconds ago."""
    when = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=age_s)
    return InstanceInfo(INSTANCE, NODE, "us-east-1a", "running", dict(MANAGED), launch_time=when)


@pytest.mark.parametrize(
    ("receive_count", "event_age_s", "cached_s", "fresh_s", "drained", "fresh_reads"),
    [
        # first delivery of a new warning, the instance launched long before it: drained, nothing read again
        (1, 0, 3600, None, True, 0),
        # the cache already shows a start after the warning: over, without a read
        (1, 120, 30, None, False, 0),
        # requeued: read fresh, started since the warning (a Spot stop, then a start): over
        (2, 120, 3600, 30, False, 1),
        # requeued, still the launch from before the warning: drained
        (2, 120, 3600, None, True, 1),
        # first delivered long after its time (the controller was away): read fresh, started since
        (1, 600, 3600, 30, False, 1),
    ],
)
async def test_an_interruption_older_than_the_instance_s_last_start_is_over(
    env: Any,
    receive_count: int,
    event_age_s: float,
    cached_s: float,
    fresh_s: float | None,
    drained: bool,
    fresh_reads: int,
) -> None:
    """Explorer seed 513: a Spot warning (stop) was requeued by a blocked drain; meanwhile the instance stopped,
    was started again and its node given back (UNCORDON_ON_RETURN); the requeued warning then cordoned and
    drained the returned node, recording the new LaunchTime, so nothing ever undid it. Every event of the
    operation is older than the instance's last start: the interruptions it warned of are over."""
    world = World(settings())
    world.resolver.info = launched(cached_s)
    if fresh_s is not None:
        world.resolver.fresh_info = launched(fresh_s)
    operation = world.receive(spot(age_s=event_age_s, receive_count=receive_count))
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-spot": MessageOutcome.DELETE})
    assert bool(world.node()["spec"].get("unschedulable")) is drained
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == (not drained)
    assert world.resolver.fresh_reads == fresh_reads


async def test_a_warning_that_joins_while_ec2_is_read_again_is_drained(env: Any) -> None:
    """A requeued warning from before the last start is over, but a new warning for the instance's new run
    joins the operation while EC2 is read again: the operation must drain for it, not end with the old one."""
    world = World(settings())
    world.resolver.info = launched(3600)
    world.resolver.fresh_info = launched(30)
    operation = world.receive(spot(age_s=120, receive_count=2))
    assert operation is not None
    world.resolver.on_fresh = lambda: world.receive(spot("m-new"))
    outcome, messages = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.node()["spec"]["unschedulable"] is True
    assert messages == {"m-spot": MessageOutcome.DELETE, "m-new": MessageOutcome.DELETE}
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == 0


async def test_a_second_stop_that_joins_while_ec2_is_read_again_is_judged_too(env: Any) -> None:
    """Explorer seed 2159 (two replicas, a warm pool's stop and return in one second): the ``stopping`` and
    ``stopped`` messages came together to the replica that had not drained the stop; ``stopped`` joined while EC2
    was read again for ``stopping``, and the join alone made the operation cordon the returned node. A stop that
    joins is judged as the first was: the instance runs again, the node stays in service."""
    world = World(settings())
    first = stopped()
    world.resolver.info = InstanceInfo(
        INSTANCE, NODE, "us-east-1a", "running", dict(MANAGED), launch_time=first.time.replace(microsecond=0)
    )
    operation = world.receive(first)
    assert operation is not None
    joins = [stopped("m-stopped", "stopped")]
    world.resolver.on_fresh = lambda: joins and world.receive(joins.pop())
    outcome, messages = await world.run(operation)
    assert outcome is Outcome.DONE
    assert "unschedulable" not in world.node()["spec"]
    assert messages == {"m-stop": MessageOutcome.DELETE, "m-stopped": MessageOutcome.DELETE}
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == 1


async def test_a_stop_delivered_after_the_instance_started_again_leaves_the_returned_node_alone(
    env: Any,
) -> None:
    """Explorer seed 2159 again (two replicas): a warm pool stopped an instance at 06:07:18 and started it in the
    same second; the ``stopped`` message reached SQS 1.7 s later (SentTimestamp 06:07:19.7), after the start. Its
    SentTimestamp is later than the new LaunchTime, its own time (the state change's) is not: the instance runs
    again since that stop, so its node stays in service instead of being cordoned for good."""
    world = World(settings())
    stop_time = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    world.resolver.info = InstanceInfo(
        INSTANCE, NODE, "us-east-1a", "running", dict(MANAGED), launch_time=stop_time
    )
    sent = ref("m-stopped").model_copy(update={"sent_timestamp": stop_time + timedelta(seconds=1.7)})
    event = StateChangeEvent(instance_id=INSTANCE, time=stop_time, state="stopped", message=sent)
    operation = world.receive(event)
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-stopped": MessageOutcome.DELETE})
    assert "unschedulable" not in world.node()["spec"]
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == 1


async def test_a_notice_stamped_before_the_last_start_but_sent_after_it_is_drained(env: Any) -> None:
    """A notice's ``time`` can be earlier than its message was sent (the sandbox stamps its compressed notices
    so; EventBridge may deliver late): what counts is the send (SQS SentTimestamp), not the stamp."""
    world = World(settings())
    world.resolver.info = launched(30)
    event = spot(age_s=300)
    now = datetime.now(UTC)
    sent = SqsMessageRef(queue_url=QUEUE, message_id="m-spot", receipt_handle="rh", sent_timestamp=now)
    operation = world.receive(event.model_copy(update={"message": sent}))
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.node()["spec"]["unschedulable"] is True
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == 0


async def test_a_terminate_action_older_than_the_instance_s_last_start_is_still_drained_and_completed(
    env: Any,
) -> None:
    """Explorer seed 29: Spot hibernated an instance while its terminate action into a warm pool waited, and
    the instance was started again: the action was still open. Only its completion ends it, so an operation
    with a lifecycle action is drained and completed whatever the instance's LaunchTime says."""
    world = World(settings())
    world.resolver.info = launched(3600)
    world.resolver.fresh_info = launched(30)
    operation = world.receive(terminate(age_s=600, receive_count=3))
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert world.node()["spec"]["unschedulable"] is True
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == 0
    await world.heartbeats.close()


async def test_a_stop_beside_a_terminate_action_is_drained_whatever_ec2_says(env: Any) -> None:
    world = World(settings())
    operation = world.receive(stopped())
    assert operation is not None
    world.receive(terminate())
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.node()["spec"]["unschedulable"] is True
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]


# ------------------------------------------------------------------------------------- EarlyExit paths


async def test_a_blocked_drain_requeues_and_the_action_keeps_its_heartbeat(env: Any) -> None:
    world = World(settings(node_termination_grace_period=1))
    world.kube.refuse_evictions = True
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.RETRY, {"m-asg": MessageOutcome.REQUEUE})
    assert world.count("actions_total", node_action="cordon-and-drain", node_status="error") == 1
    assert world.count("actions_total", node_action="post-drain", node_status="success") == 0
    assert world.heartbeats.running == 1  # heartbeated across the requeue
    assert our_tasks() == {t for t in our_tasks() if t.get_name().startswith("heartbeat-")}
    await world.heartbeats.close()


async def test_a_lease_held_by_another_replica_is_waited_for_and_the_spot_warning_handed_over(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47.1: the replica that receives a Spot warning for a node another replica drains hands the warning
    over on the node's Lease (the holder's drain takes it) and waits for the Lease, its message held, instead of
    requeuing it; once the holder releases the Lease it finishes the operation (the Lease watch is not running
    here: it tries its claim again every UNWATCHED_POLL_S)."""
    monkeypatch.setattr("queue_processor.watch.UNWATCHED_POLL_S", 0.01)
    world = World(settings(node_leases=True), leases=True)
    other = NodeLeases(world.kube, namespace="ops", identity="replica-b")  # type: ignore[arg-type]
    held = await other.claim(NODE)
    assert held is not None
    warning = spot()
    operation = world.receive(warning)
    assert operation is not None
    running = asyncio.create_task(world.run(operation))

    def handed() -> list[str]:
        annotations = world.kube.leases[held.name]["metadata"].get("annotations") or {}
        return [key for key in annotations if key.startswith("queue-processor/event.")]

    await until(lambda: bool(handed()))
    assert handed() == [f"queue-processor/event.{warning.event_id}"]
    assert "unschedulable" not in world.node()["spec"]  # not ours while the other holds it
    assert not running.done()
    await held.release()
    await other.flush()
    outcome, messages = await running
    assert (outcome, messages) == (Outcome.DONE, {"m-spot": MessageOutcome.DELETE})
    assert world.node()["spec"]["unschedulable"] is True
    assert world.count("queue_processor_operation_outcomes_total", outcome="lease-held") == 0


async def test_a_stop_that_waited_for_the_lease_asks_again_whether_the_instance_started(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Explorer seed 1504: a stop's duplicate waited for the node's Lease while another replica drained the
    node for the stop; the instance left its warm pool meanwhile. Once the Lease is free, EC2 is read again:
    running since, nothing to drain, the node of an instance in service is not cordoned."""
    monkeypatch.setattr("queue_processor.watch.UNWATCHED_POLL_S", 0.01)
    world = World(settings(node_leases=True), leases=True)
    world.resolver.fresh_info = InstanceInfo(INSTANCE, NODE, "us-east-1a", "stopped", dict(MANAGED))
    other = NodeLeases(world.kube, namespace="ops", identity="replica-b")  # type: ignore[arg-type]
    held = await other.claim(NODE)
    assert held is not None
    operation = world.receive(stopped())
    assert operation is not None
    running = asyncio.create_task(world.run(operation))
    await until(lambda: world.resolver.fresh_reads == 1)  # still stopped: drained once the Lease is free
    world.resolver.fresh_info = launched(0)
    await held.release()
    await other.flush()
    outcome, messages = await running
    assert (outcome, messages) == (Outcome.DONE, {"m-stop": MessageOutcome.DELETE})
    assert "unschedulable" not in world.node()["spec"]
    assert world.count("queue_processor_operation_outcomes_total", outcome="started-again") == 1


async def test_a_lease_held_until_the_deadline_requeues(env: Any) -> None:
    world = World(settings(node_leases=True), leases=True)
    other = NodeLeases(world.kube, namespace="ops", identity="replica-b")  # type: ignore[arg-type]
    held = await other.claim(NODE)
    assert held is not None
    operation = world.receive(spot(age_s=119.9))  # its notice ends as it is received
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.RETRY
    assert "unschedulable" not in world.node()["spec"]
    assert world.count("queue_processor_operation_outcomes_total", outcome="lease-held") == 1
    await held.release()


def rank_requests(world: World) -> list[tuple[str, float]]:
    """Record the name each urgent call of ``world``'s API server is about (a node, a Lease, a label selector
    of Leases) and the rank it was made at (queue_processor.rest.URGENT_RANK)."""
    ranks: list[tuple[str, float]] = []
    kube = world.kube
    create, replace, patch = kube.create_lease, kube.replace_lease, kube.patch_node
    get_node, delete_leases = kube.get_node, kube.delete_leases

    async def ranked_create(namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        ranks.append((lease["metadata"]["name"], URGENT_RANK.get()))
        return await create(namespace, lease)

    async def ranked_replace(namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        ranks.append((lease["metadata"]["name"], URGENT_RANK.get()))
        return await replace(namespace, lease)

    async def ranked_patch(name: str, body: Any, patch_type: str = "strategic") -> dict[str, Any]:
        ranks.append((name, URGENT_RANK.get()))
        return await patch(name, body, patch_type)

    async def ranked_get_node(name: str) -> dict[str, Any] | None:
        ranks.append((name, URGENT_RANK.get()))
        return await get_node(name)

    async def ranked_delete_leases(namespace: str, label_selector: str, **kwargs: Any) -> list[str]:
        ranks.append(("released", URGENT_RANK.get()))
        return await delete_leases(namespace, label_selector, **kwargs)

    kube.create_lease = ranked_create  # type: ignore[method-assign]
    kube.replace_lease = ranked_replace  # type: ignore[method-assign]
    kube.patch_node = ranked_patch  # type: ignore[method-assign]
    kube.get_node = ranked_get_node  # type: ignore[method-assign]
    kube.delete_leases = ranked_delete_leases  # type: ignore[method-assign]
    return ranks


async def test_an_operation_s_claim_and_cordon_rank_by_its_start_and_the_replica_lease_first(
    env: Any,
) -> None:
    """In a storm the urgent requests wait for tokens in order of rank (queue_processor.rest.URGENT_RANK):
    an operation's claim and cordon carry its start, so the node received first is cordoned first; what it
    does after its cordon (a kind that joins: its taint) and its Lease's release wait for every other
    operation's claim and cordon; the replica Lease's write, though a claim asked for it, ranks ahead of
    every operation's (a late renewal loses every node held)."""
    world = World(settings(node_leases=True, taint_node=True), leases=True)
    ranks = rank_requests(world)
    operation = world.receive(spot())
    assert operation is not None

    async def join(name: str) -> None:  # a rebalance recommendation joins during the drain
        world.kube.on_evict = None
        world.receive(rebalance())

    world.kube.on_evict = join
    outcome, _ = await asyncio.create_task(world.run(operation))  # its own task, as the consumer runs it
    assert outcome is Outcome.DONE
    assert world.leases is not None
    replica = world.leases.replica.name
    start = operation.started_at
    # its node found, claimed, read and cordoned; then read and tainted for the kind that joined, and released
    assert [name for name, rank in ranks if rank == start] == [NODE, lease_name(NODE), NODE, NODE]
    assert [name for name, rank in ranks if rank == math.inf] == [NODE, NODE, "released"]
    assert {rank for name, rank in ranks if name == replica} == {-math.inf}
    assert {name for name, _ in ranks} == {lease_name(NODE), NODE, replica, "released"}


async def test_node_lease_releases_wait_for_every_drain_s_claim_and_cordon_whoever_sends_them(
    env: Any,
) -> None:
    """A claim given up before its cordon (no node, another holder) leaves its release to the batch: the batch
    waits behind every operation's claim and cordon, not at the rank of the operation that began it."""
    world = World(settings(node_leases=True), leases=True)
    assert world.leases is not None
    ranks = rank_requests(world)

    async def claim_and_give_up() -> None:
        URGENT_RANK.set(1234.5)  # an operation's task, before its cordon
        claim = await world.leases.claim(NODE)  # type: ignore[union-attr]
        assert claim is not None
        await claim.release()
        await world.leases.flush()  # type: ignore[union-attr]

    await asyncio.create_task(claim_and_give_up())
    assert ("released", math.inf) in ranks
    assert (lease_name(NODE), 1234.5) in ranks


async def test_a_launch_s_node_lookups_wait_for_every_drain_s_claim_and_cordon(env: Any) -> None:
    """A launch polls for its node for up to LAUNCH_READY_TIMEOUT_SEC: ranked by its start, a launch begun
    before a storm would hold the storm's cordons back for as long as it polls."""
    world = World(settings(launch_ready_timeout_sec=900))
    world.kube.nodes[NODE]["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    ranks = rank_requests(world)
    operation = world.receive(launch())
    assert operation is not None
    outcome, _ = await asyncio.create_task(world.run(operation))
    assert outcome is Outcome.DONE
    assert ranks  # it looked its node up
    assert {rank for _, rank in ranks} == {math.inf}


async def test_a_lease_lost_mid_drain_cancels_the_operation_and_nothing_is_completed(env: Any) -> None:
    world = World(settings(node_leases=True), leases=True)
    operation = world.receive(terminate())
    assert operation is not None

    async def taken_over(name: str) -> None:
        if name == "web-1":  # the process was paused for longer than its replica Lease lasts
            assert world.handler.parts.leases is not None
            world.handler.parts.leases.replica.renewed_at -= 61
            lease = world.kube.leases[lease_name(NODE)]  # and another replica took the node's Lease
            lease["spec"]["holderIdentity"] = "replica-b"
            world.kube._bump(lease)

    world.kube.on_evict = taken_over
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.RETRY, {"m-asg": MessageOutcome.REQUEUE})
    assert world.kube.evicted == ["web-0", "web-1"]  # none after the Lease was taken (during web-1's)
    assert world.autoscaling.made("CompleteLifecycleAction") == []
    assert world.count("queue_processor_operation_outcomes_total", outcome="lease-lost") == 1
    assert world.kube.leases[lease_name(NODE)]["spec"]["holderIdentity"] == "replica-b"  # not released
    await world.heartbeats.close()
    assert our_tasks() == set()


async def test_a_long_budget_blocked_drain_keeps_its_own_lease_through_concurrent_renewals(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue "Interruptions in combination" 1: a PodDisruptionBudget holds the drain for many renewal periods
    while each pod's eviction is retried, every retry confirming the Lease, on an API server that answers
    Lease writes slowly. The renewals are ours: one operation, never lease-lost, the Lease released."""
    monkeypatch.setattr("queue_processor.drain.evictions.EVICTION_RETRY_S", (0.005, 0.01))
    world = World(settings(node_leases=True), leases=True)
    assert world.leases is not None
    world.leases.renew_every_s = 0.01  # many renewal periods pass during the drain
    refusals = [60]  # the budget relaxes after 60 refused evictions (of three pods, retried concurrently)
    original_evict, original_replace = world.kube.evict, world.kube.replace_lease

    async def budget(namespace: str, name: str, grace_s: int | None = None, **kwargs: Any) -> None:
        world.kube.refuse_evictions = refusals[0] > 0
        refusals[0] -= 1
        await original_evict(namespace, name, grace_s, **kwargs)

    async def slow_write(namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        answer = await original_replace(namespace, lease)
        await asyncio.sleep(0.02)  # a busy API server: the answer comes late
        return answer

    world.kube.evict = budget  # type: ignore[method-assign]
    world.kube.replace_lease = slow_write  # type: ignore[method-assign]
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert world.count("queue_processor_operation_outcomes_total", outcome="lease-lost") == 0
    assert sorted(world.kube.evicted) == ["web-0", "web-1", "web-2"]
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert lease_name(NODE) not in world.kube.leases  # released
    assert our_tasks() == set()


async def test_heartbeat_access_denied_never_blocks_the_cordon_or_the_drain(env: Any) -> None:
    # NTH's documented IAM policy has no autoscaling:DescribeLifecycleHooks.
    world = World(settings(node_leases=True), autoscaling=FakeAutoscaling(deny_describe=True), leases=True)
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert sorted(world.kube.evicted) == ["web-0", "web-1", "web-2"]
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert lease_name(NODE) not in world.kube.leases  # released
    assert our_tasks() == set()


async def test_heartbeat_set_up_never_delays_the_cordon(env: Any) -> None:
    class SlowHook(FakeAutoscaling):
        async def describe_lifecycle_hooks(self, **kwargs: Any) -> dict[str, Any]:
            await asyncio.Event().wait()  # never answers
            return {}

    world = World(settings(), autoscaling=SlowHook())
    operation = world.receive(terminate())
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert our_tasks() == set()


async def test_a_failed_step_under_a_lease_is_logged_once_by_the_operation(env: Any) -> None:
    # With NODE_LEASES a step runs as a task guarded by the Lease; its failure goes up to the operation, which
    # logs it once ("operation failed"), and the step's own task does not log it again as an error.
    world = World(settings(node_leases=True), leases=True)

    def refuse(token: str) -> None:
        raise RuntimeError("CompleteLifecycleAction refused")

    world.autoscaling.on_complete = refuse
    operation = world.receive(terminate())
    assert operation is not None
    with structlog.testing.capture_logs() as logs:
        outcome, _ = await world.run(operation)
    assert outcome is Outcome.RETRY
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["operation failed"]
    assert world.count("actions_total", node_action="post-drain", node_status="error") == 1
    await world.heartbeats.close()
    assert our_tasks() == set()


@pytest.mark.parametrize("leases", [False, True], ids=["no-lease", "lease"])
async def test_shutdown_cancels_the_operation_and_stops_every_heartbeat(env: Any, leases: bool) -> None:
    # With a Lease the drain runs guarded (the Lease-lost watcher), beside the joiners' watcher and the Lease's
    # renewal: every one of them ends with the operation.
    world = World(settings(node_termination_grace_period=600, node_leases=leases), leases=leases)
    world.kube.refuse_evictions = True
    operation = world.receive(terminate())
    assert operation is not None
    task = asyncio.create_task(world.handler.handle(operation))
    await until(lambda: world.node()["spec"].get("unschedulable") is True)
    await until(lambda: any(t.get_name().startswith("joiners-") for t in our_tasks()))
    if leases:
        assert {t.get_name().split("-")[0] for t in our_tasks()} >= {"lease", "joiners"}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await world.heartbeats.close()
    if world.leases is not None:
        await world.leases.close()  # the shutdown's: the node Lease's release sent
    assert our_tasks() == set()


# ---------------------------------------------------------------------------------- the bugs it hid


async def test_an_action_that_joins_during_post_drain_is_completed(env: Any) -> None:
    # A Spot warning drains the node; the ASG terminate action arrives while PostDrain completes: the action
    # must be completed (or, joining after the last completion, keep its message), never acknowledged alone.
    world = World(settings(enable_out_of_service_taint=True))
    operation = world.receive(spot())
    assert operation is not None
    original = world.drainer.writes.taint

    async def join_then_taint(node: str, key: str, value: str, effect: str, **kwargs: Any) -> None:
        world.receive(terminate())
        await original(node, key, value, effect, **kwargs)

    world.drainer.writes.taint = join_then_taint  # type: ignore[method-assign]
    outcome, messages = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert messages == {"m-spot": MessageOutcome.DELETE, "m-asg": MessageOutcome.DELETE}


async def test_an_action_that_joins_after_the_last_completion_keeps_its_message(env: Any) -> None:
    world = World(settings(node_leases=True), leases=True)
    operation = world.receive(spot())
    assert operation is not None
    assert world.leases is not None
    original = world.leases.replica.drop

    async def join_on_release(claim: Claim) -> None:
        if claim.name == lease_name(NODE):  # the Lease is being released: the last await
            world.receive(terminate())
        await original(claim)

    world.leases.replica.drop = join_on_release  # type: ignore[method-assign]
    outcome, messages = await world.run(operation)
    assert outcome is Outcome.DONE
    assert messages == {"m-spot": MessageOutcome.DELETE, "m-asg": MessageOutcome.REQUEUE}
    assert world.heartbeats.running == 1  # and heartbeated until the redelivery completes it
    again = world.receive(terminate())
    assert again is not None
    outcome, messages = await world.run(again)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]


async def test_a_failed_heartbeat_is_retried_within_seconds(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queue_processor import lifecycle

    monkeypatch.setattr(lifecycle, "RETRY_S", (0.01, 0.02))
    monkeypatch.setattr("queue_processor.aws.ATTEMPTS", 1)
    autoscaling = FakeAutoscaling(heartbeat_timeout_s=60)
    autoscaling.fail_heartbeats = 3
    world = World(settings(), autoscaling=autoscaling)
    action = terminate(age_s=3600)  # older than an interval: the first beat is due at once
    world.receive(action)
    await until(lambda: bool(autoscaling.made("RecordLifecycleActionHeartbeat")))
    assert len(autoscaling.made("RecordLifecycleActionHeartbeat:Throttling")) == 3
    await world.heartbeats.close()


async def test_a_completed_action_gets_no_heartbeat_after_its_completion(env: Any) -> None:
    autoscaling = FakeAutoscaling()
    autoscaling.complete_gate = asyncio.Event()
    world = World(settings(), autoscaling=autoscaling)
    operation = world.receive(terminate(age_s=3600))
    assert operation is not None
    task = asyncio.create_task(world.run(operation))
    await until(lambda: bool(autoscaling.made("RecordLifecycleActionHeartbeat")))
    await until(lambda: world.heartbeats.running == 0)  # stopped before CompleteLifecycleAction is sent
    autoscaling.complete_gate.set()
    await task
    last = max(i for i, (op, _) in enumerate(autoscaling.calls) if op == "RecordLifecycleActionHeartbeat")
    done = autoscaling.calls.index(("CompleteLifecycleAction", "tok-1"))
    assert last < done


async def test_a_node_gone_right_after_its_action_was_completed_is_success(env: Any) -> None:
    """Issue "Interruptions in combination" 6: with ENABLE_OUT_OF_SERVICE_TAINT, the instance terminates as
    soon as its action is completed and its Node goes with it; the taint's read then answers 404. Every action
    was completed: that is success, not a RETRY with a PostDrainError."""
    world = World(settings(enable_out_of_service_taint=True, emit_kubernetes_events=True))
    world.autoscaling.on_complete = lambda token: world.kube.nodes.clear()
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert world.count("actions_total", node_action="post-drain", node_status="success") == 1
    assert world.count("actions_total", node_action="post-drain", node_status="error") == 0


# ------------------------------------------------------------- a nearer end joins a running drain (26.4)


async def test_a_spot_warning_joining_a_rebalance_drain_brings_its_end_and_the_deadline_step(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual order: a rebalance recommendation starts the drain (deadline NODE_TERMINATION_GRACE_PERIOD,
    no instance end), then the Spot warning for the same instance joins. The drain takes its end at once: the
    pod its budget holds is deleted DELETE_AT_DEADLINE_LEAD before the instance goes, not left there until the
    rebalance deadline (DESIGN.md rule 13)."""
    monkeypatch.setattr("queue_processor.drain.evictions.EVICTION_RETRY_S", (0.01, 0.05))
    world = World(
        settings(delete_at_deadline=True, delete_at_deadline_lead=4.5, node_termination_grace_period=3600)
    )
    world.kube.pods = [p for p in world.kube.pods if p["metadata"]["name"] == "web-0"]  # the guarded one
    world.kube.refuse_evictions = True  # its PodDisruptionBudget never allows it
    operation = world.receive(rebalance())
    assert operation is not None
    joined: list[bool] = []

    async def spot_joins(name: str) -> None:
        if not joined:
            joined.append(
                world.receive(spot(age_s=115)) is None
            )  # 5 s of notice left: joins, no new operation

    world.kube.on_evict = spot_joins
    outcome, messages = await world.run(operation)
    assert joined == [True]
    assert outcome is Outcome.DONE
    assert messages == {"m-rebalance": MessageOutcome.DELETE, "m-spot": MessageOutcome.DELETE}
    assert world.kube.deleted == ["web-0"]
    assert (
        world.count(
            "queue_processor_drain_duration_seconds_count", kind="rebalance-recommendation", result="deleted"
        )
        == 1
    )
    assert our_tasks() == set()


# ------------------------------------------------------------------ hopeless lifecycle actions (issue 26.2)


@pytest.mark.parametrize("default_result", ["ABANDON", "CONTINUE", None])  # None: the hook cannot be read
async def test_a_launch_whose_node_is_not_ready_in_time_gets_its_hooks_default_result(
    env: Any, default_result: str | None
) -> None:
    """The window runs from the action's start, not from this receive: a redelivered launch action that
    began two minutes ago, with a one-minute window, is completed now (the Terraform module lets users pick
    CONTINUE for launches when scale-out matters more), never heartbeated receive after receive."""
    autoscaling = FakeAutoscaling(deny_describe=default_result is None, default_result=default_result or "")
    world = World(settings(launch_ready_timeout_sec=60), autoscaling=autoscaling)
    action = launch(age_s=120)
    operation = world.receive(action)  # its node is registered, never Ready
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-launch": MessageOutcome.DELETE})
    assert autoscaling.results == {"tok-launch": default_result or "ABANDON"}
    assert world.count("queue_processor_operation_outcomes_total", outcome="launch-not-ready") == 1
    assert world.heartbeats.running == 0
    assert our_tasks() == set()


@pytest.mark.parametrize("state", ["shutting-down", "terminated"])
async def test_a_launch_whose_instance_ended_is_acknowledged_at_once(env: Any, state: str) -> None:
    world = World(settings(launch_ready_timeout_sec=900))
    world.resolver.info = InstanceInfo(INSTANCE, NODE, "us-east-1a", state, dict(MANAGED))
    operation = world.receive(launch())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-launch": MessageOutcome.DELETE})
    assert world.autoscaling.made("CompleteLifecycleAction") == []  # over with its instance
    assert world.count("queue_processor_operation_outcomes_total", outcome="instance-gone") == 1
    assert world.heartbeats.running == 0
    assert our_tasks() == set()


async def test_a_launch_action_already_over_is_acknowledged_without_waiting_for_its_node(env: Any) -> None:
    world = World(settings(launch_ready_timeout_sec=7200))
    action = launch(age_s=3600)  # older than a heartbeat interval: its first beat goes out at once
    operation = world.receive(action)
    assert operation is not None
    world.autoscaling.open.clear()  # it timed out already: AWS answers "No active Lifecycle Action"
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-launch": MessageOutcome.DELETE})
    assert world.autoscaling.made("CompleteLifecycleAction") == []
    assert world.count("queue_processor_operation_outcomes_total", outcome="action-over") == 1
    assert our_tasks() == set()


@pytest.mark.parametrize("lease", [False, True])
async def test_a_terminate_action_whose_instance_never_got_a_node_is_completed(env: Any, lease: bool) -> None:
    """The instance has run for longer than a node takes to register (LAUNCH_READY_TIMEOUT_SEC): there is
    nothing to drain and nothing will come, so the action is completed instead of being requeued for an hour
    while Terminating:Wait is heartbeated."""
    world = World(settings(launch_ready_timeout_sec=900, node_leases=lease), leases=lease)
    world.kube.nodes.clear()
    launched = datetime.now(UTC) - timedelta(hours=2)
    world.resolver.info = InstanceInfo(
        INSTANCE, NODE, "us-east-1a", "running", dict(MANAGED), launch_time=launched
    )
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    assert world.autoscaling.results == {"tok-1": "CONTINUE"}
    assert world.count("queue_processor_operation_outcomes_total", outcome="no-node") == 1
    assert world.heartbeats.running == 0
    assert our_tasks() == set()


async def test_a_terminate_action_whose_instance_may_still_register_a_node_is_retried(env: Any) -> None:
    world = World(settings(launch_ready_timeout_sec=900))
    world.kube.nodes.clear()
    launched = datetime.now(UTC) - timedelta(seconds=30)  # just launched: its kubelet may not be up yet
    world.resolver.info = InstanceInfo(
        INSTANCE, NODE, "us-east-1a", "running", dict(MANAGED), launch_time=launched
    )
    operation = world.receive(terminate())
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert (outcome, messages) == (Outcome.RETRY, {"m-asg": MessageOutcome.REQUEUE})
    assert world.autoscaling.made("CompleteLifecycleAction") == []
    assert world.heartbeats.running == 1  # heartbeated while a node may still come
    await world.heartbeats.close()


# ------------------------------------------------------------------------------------------- clock skew


@pytest.mark.parametrize(
    ("skew_s", "expected_s"),
    [
        (0.0, 120.0),  # a fresh Spot warning: the rest of its two minutes
        (
            -600.0,
            120.0,
        ),  # its time 10 min in the past by this clock (late, or this clock is ahead): from receipt
        (
            600.0,
            300.0,
        ),  # its time in the future (this clock is behind): NODE_TERMINATION_GRACE_PERIOD bounds it
    ],
)
async def test_a_skewed_notice_still_gets_a_drain_and_never_more_than_the_grace_period(
    env: Any, skew_s: float, expected_s: float
) -> None:
    world = World(settings(node_termination_grace_period=300))
    event = spot().model_copy(update={"time": datetime.now(UTC) + timedelta(seconds=skew_s)})
    operation = world.receive(event)
    assert operation is not None
    deadlines: list[float] = []
    drain = world.drainer.drain

    async def recording(node: str, bounds: DrainBounds, **kwargs: Any) -> Any:
        deadlines.append(bounds.deadline - world.handler.parts.clock())
        return await drain(node, bounds, **kwargs)

    world.drainer.drain = recording  # type: ignore[method-assign]
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert deadlines == [pytest.approx(expected_s, abs=5)]  # seconds left when the drain began


def scheduled(in_s: float) -> ScheduledChangeEvent:
    return ScheduledChangeEvent(
        instance_id=INSTANCE,
        time=datetime.now(UTC),
        scheduled_start_time=datetime.now(UTC) + timedelta(seconds=in_s),
        source_id="health-1",
        event_arn="arn:aws:health:us-east-1::event/EC2/INSTANCE_RETIREMENT_SCHEDULED/1",
        message=ref("m-health"),
    )


@pytest.mark.parametrize(
    ("events", "deadline_s", "end_s"),
    [  # factories: an event's time is when the test runs, not when it is collected
        (lambda: [spot()], 120.0, 120.0),  # a Spot notice: the drain and the instance end together
        (lambda: [terminate()], 300.0, None),  # a lifecycle hook holds the instance: no end to cut grace to
        (lambda: [terminate(), scheduled(60.0)], 300.0, 60.0),  # a Health start cuts grace, never the drain
        (lambda: [scheduled(-60.0)], 300.0, None),  # a start already past says nothing of the instance's end
    ],
)
async def test_the_drain_is_told_when_the_instance_ends(
    env: Any, events: Callable[[], list[Any]], deadline_s: float, end_s: float | None
) -> None:
    world = World(settings(node_termination_grace_period=300))
    operation = None
    for event in events():
        operation = world.receive(event) or operation
    assert operation is not None
    seen: list[tuple[float, float | None]] = []
    drain = world.drainer.drain

    async def recording(node: str, bounds: DrainBounds, **kwargs: Any) -> Any:
        now, end = world.handler.parts.clock(), bounds.instance_end
        seen.append((bounds.deadline - now, None if end is None else end - now))
        return await drain(node, bounds, **kwargs)

    world.drainer.drain = recording  # type: ignore[method-assign]
    await world.run(operation)
    ((deadline, end),) = seen
    assert deadline == pytest.approx(deadline_s, abs=5)
    assert end == (None if end_s is None else pytest.approx(end_s, abs=5))


# ----------------------------------------------------------------------------------------------- webhook


class SeenWebhook(Webhook):
    """Records each notification with what the world looked like when it was sent."""

    def __init__(self, world: World) -> None:
        super().__init__("http://127.0.0.1:9/hook", headers={}, template="")
        self.world = world
        self.seen: list[tuple[Struct, list[str], list[str]]] = []  # data, pods left, completions made

    async def notify(self, data: Struct) -> None:
        pods = [p["metadata"]["name"] for p in self.world.kube.pods]
        self.seen.append((data, pods, self.world.autoscaling.made("CompleteLifecycleAction")))


def with_webhook(world: World) -> SeenWebhook:
    webhook = SeenWebhook(world)
    world.handler.parts.webhook = webhook
    return webhook


async def test_the_webhook_goes_after_the_drain_and_before_the_completion_as_nths(env: Any) -> None:
    world = World(settings())
    webhook = with_webhook(world)
    world.node()["metadata"]["labels"]["team"] = "ops"
    operation = world.receive(terminate())
    assert operation is not None
    assert await world.run(operation) == (Outcome.DONE, {"m-asg": MessageOutcome.DELETE})
    ((data, pods_left, completed),) = webhook.seen
    assert (pods_left, completed) == ([], [])  # drained, not completed yet
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-1"]
    assert (data["Kind"], data["NodeName"], data["AutoScalingGroupName"]) == (
        "ASG_LIFECYCLE",
        NODE,
        "workers",
    )
    assert data["Pods"] == ["web-0", "web-1", "web-2"]  # read before the drain
    assert data["NodeLabels"] == {"team": "ops"}


async def test_the_webhook_goes_after_a_failed_drain_too_and_never_for_a_launch(env: Any) -> None:
    world = World(settings(node_termination_grace_period=1))
    webhook = with_webhook(world)
    world.kube.refuse_evictions = True
    operation = world.receive(spot())
    assert operation is not None
    assert (await world.run(operation))[0] is Outcome.RETRY
    ((data, pods_left, _),) = webhook.seen
    assert (data["Kind"], len(pods_left)) == ("SPOT_ITN", 3)
    world.kube.refuse_evictions = False
    world.kube.nodes[NODE]["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    launching = world.receive(launch())
    assert launching is not None
    assert (await world.run(launching))[0] is Outcome.DONE
    assert len(webhook.seen) == 1


async def test_a_dry_run_sends_the_webhook_with_nths_empty_labels_and_pods(env: Any) -> None:
    world = World(settings(dry_run=True))
    webhook = with_webhook(world)
    operation = world.receive(spot())
    assert operation is not None
    await world.run(operation)
    ((data, pods_left, _),) = webhook.seen
    assert (data["Pods"], data["NodeLabels"], len(pods_left)) == ([], {}, 3)
    assert parse("{{ .Pods }} {{ .NodeLabels }} {{ .Pods | toJson }}").execute(data) == "[] map[] null"


async def test_each_interruption_taken_up_gets_its_own_webhook_as_in_nth(env: Any) -> None:
    """A Spot warning and a rebalance recommendation for one node: one drain, two requests (NTH handles,
    and posts for, each event)."""
    world = World(settings())
    webhook = with_webhook(world)
    operation = world.receive(spot())
    assert operation is not None
    assert world.receive(rebalance()) is None  # joins the operation
    await world.run(operation)
    kinds = [data["Kind"] for data, _, _ in webhook.seen]
    assert kinds == ["SPOT_ITN", "REBALANCE_RECOMMENDATION"]
    assert webhook.seen[1][0]["EventID"] == "rebalance-recommendation-event-" + b"rebalance-m-rebalance".hex()


class NodesCopy:
    """A current watched copy of the fake's nodes (:class:`queue_processor.watch.NodeCache`)."""

    live = True

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube

    def get(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.kube.nodes.get(name))

    def absent(self, dns_name: str) -> bool:
        return dns_name not in self.kube.nodes

    async def wait_first_answer(self, timeout_s: float) -> bool:
        return True


class CopyComing(NodesCopy):
    """A watched copy not in yet: it is once its first answer was waited for."""

    live = False

    def get(self, name: str) -> dict[str, Any] | None:
        return super().get(name) if self.live else None

    async def wait_first_answer(self, timeout_s: float) -> bool:
        await asyncio.sleep(0)
        self.live = True
        return True


@pytest.mark.parametrize("leases", [False, True])
async def test_a_claim_and_a_cordon_at_start_up_wait_for_the_watched_copy_rather_than_reading_the_node(
    env: Any, leases: bool
) -> None:
    """The storm is in the queue when the controller starts: a claim (which must know the node's name before
    its Lease) and a cordon wait for the copy's first answer, bounded, rather than reading the node with a GET
    each, urgent requests the copy's own pages would wait behind."""
    world = World(settings(), leases=leases)
    world.drainer.writes.nodes = CopyComing(world.kube)  # type: ignore[assignment]
    reads: list[str] = []
    get_node = world.kube.get_node

    async def counted_get(name: str) -> dict[str, Any] | None:
        reads.append(name)
        return await get_node(name)

    world.kube.get_node = counted_get  # type: ignore[method-assign]
    operation = world.receive(spot())
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.kube.nodes[NODE]["spec"]["unschedulable"] is True
    assert reads == []
    await world.heartbeats.close()


async def test_the_provider_id_lookup_does_not_wait_for_the_watched_copy(env: Any) -> None:
    """With USE_PROVIDER_ID the claim's lookup reads no copy (the finder lists and reads the node itself), so it
    starts at once; only the cordon, which writes on the copy, waits for it."""
    world = World(settings(use_provider_id=True), leases=True)
    order: list[str] = []

    class Recorded(CopyComing):
        async def wait_first_answer(self, timeout_s: float) -> bool:
            order.append("wait")
            return await super().wait_first_answer(timeout_s)

    world.drainer.writes.nodes = Recorded(world.kube)  # type: ignore[assignment]
    finder = world.handler.parts.finder
    find = finder.find

    async def recorded_find(info: InstanceInfo) -> dict[str, Any] | None:
        order.append("find")
        return await find(info)

    finder.find = recorded_find  # type: ignore[method-assign]
    operation = world.receive(spot())
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert order[:2] == ["find", "wait"]
    await world.heartbeats.close()


@pytest.mark.parametrize("leases", [False, True])
@pytest.mark.parametrize(
    ("state", "read"), [("terminated", False), ("shutting-down", False), ("stopping", True)]
)
async def test_an_ended_instance_whose_node_the_watched_copy_has_not_is_done_without_a_node_read(
    env: Any, leases: bool, state: str, read: bool
) -> None:
    """A storm's instances publish a state change each when their notice ends: with the node already gone
    from the watched copy, the message is done with no node GET or LIST (no cordon, no Lease); an instance that
    may come back (stopping) is still looked up."""
    world = World(settings(), leases=leases)
    world.drainer.writes.nodes = NodesCopy(world.kube)  # type: ignore[assignment]
    del world.kube.nodes[NODE]
    world.resolver.info = InstanceInfo(INSTANCE, NODE, "us-east-1a", state, dict(MANAGED))
    calls: list[str] = []
    get_node, patch_node = world.kube.get_node, world.kube.patch_node

    async def counted_get(name: str) -> dict[str, Any] | None:
        calls.append("get")
        return await get_node(name)

    async def counted_patch(name: str, patch: Any, patch_type: str = "strategic") -> dict[str, Any]:
        calls.append("patch")
        return await patch_node(name, patch, patch_type)

    world.kube.get_node = counted_get  # type: ignore[method-assign]
    world.kube.patch_node = counted_patch  # type: ignore[method-assign]
    operation = world.receive(stopped(state=state))
    assert operation is not None
    outcome, messages = await world.run(operation)
    assert bool(calls) is read
    assert world.kube.leases == {}
    if not read:
        assert (outcome, messages) == (Outcome.DONE, {"m-stop": MessageOutcome.DELETE})
        assert world.count("queue_processor_operation_outcomes_total", outcome="instance-gone") == 1
    await world.heartbeats.close()


async def test_a_launch_waits_for_its_node_on_the_watched_copy_without_a_request(env: Any) -> None:
    """Issue 47.9: each poll for a launching instance's node was a GET and a LIST, urgent: some 300 launches at
    once (Capacity Rebalancing during a fleet-wide rebalance) filled KUBE_API_QPS and left evictions no token
    until those nodes were Ready. The watched copy of the nodes has the Ready condition: no request at all."""
    from queue_processor.watch import NodeCache, slim

    world = World(settings(launch_ready_timeout_sec=900))
    del world.kube.nodes[NODE]  # not registered yet
    copy = NodeCache(world.kube)  # type: ignore[arg-type]
    copy._set_live(True)
    world.drainer.writes.nodes = copy
    requests: list[str] = []
    get_node = world.kube.get_node

    async def counted(name: str) -> dict[str, Any] | None:
        requests.append(name)
        return await get_node(name)

    world.kube.get_node = counted  # type: ignore[method-assign]
    operation = world.receive(launch())
    assert operation is not None
    running = asyncio.create_task(world.run(operation))
    for _ in range(20):  # several polls
        await asyncio.sleep(0.05)
    assert not running.done()
    world.kube.add_node()  # the kubelet registers it, Ready; the watch delivers it
    world.kube.nodes[NODE]["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    copy._put(slim(world.kube.nodes[NODE]))
    outcome, _ = await running
    assert outcome is Outcome.DONE
    assert world.autoscaling.made("CompleteLifecycleAction") == ["tok-launch"]
    assert requests == []


async def test_a_launch_whose_window_is_over_reads_its_node_once_before_giving_up(env: Any) -> None:
    """Explorer seed 2151: a replica paused past a launch's window woke to its watched copy of the nodes, which
    had not caught up with the node registered and Ready meanwhile, and completed the action with the hook's
    DefaultResult (ABANDON: the Ready instance was terminated). The window's end reads the node itself."""
    from queue_processor.watch import NodeCache

    world = World(settings(launch_ready_timeout_sec=60))
    world.kube.nodes[NODE]["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    copy = NodeCache(world.kube)  # type: ignore[arg-type]
    copy._set_live(True)  # live, but behind: it has not seen the node yet
    world.drainer.writes.nodes = copy
    operation = world.receive(launch(age_s=120))  # its window ended a minute ago
    assert operation is not None
    outcome, _ = await world.run(operation)
    assert outcome is Outcome.DONE
    assert world.autoscaling.results == {"tok-launch": "CONTINUE"}


async def test_an_action_received_again_after_another_consumer_completed_it_gets_no_heartbeat(
    env: Any,
) -> None:
    """Issue 47.10 (explorer seed 332025): a replica killed holding a launch action's message comes back and
    receives it again, after the other replica completed the action. Its heartbeat was due at once (the action
    is older than the interval) and was refused, "No active Lifecycle Action". Auto Scaling is asked first
    whether the instance still waits: it does not, and no heartbeat is sent."""
    autoscaling = FakeAutoscaling(heartbeat_timeout_s=20)
    world = World(settings(), autoscaling=autoscaling)
    action = launch(age_s=30)  # the hook's timer: a beat every 10 s, this one due at once
    autoscaling.waiting[INSTANCE] = "InService"
    world.heartbeats.start(action)  # the receive; the action is not open (another consumer completed it)
    await until(lambda: world.heartbeats.over(action))
    assert [op for op, _ in autoscaling.calls if op.startswith("RecordLifecycleActionHeartbeat")] == []
    assert ("DescribeAutoScalingInstances", "") in autoscaling.calls
    await world.heartbeats.close()


async def test_an_action_received_again_that_still_waits_is_heartbeated_at_once(env: Any) -> None:
    autoscaling = FakeAutoscaling(heartbeat_timeout_s=20)
    world = World(settings(), autoscaling=autoscaling)
    action = launch(age_s=30)
    autoscaling.open.add("tok-launch")
    autoscaling.waiting[INSTANCE] = "Pending:Wait"
    world.heartbeats.start(action)
    await until(lambda: autoscaling.made("RecordLifecycleActionHeartbeat") == ["tok-launch"])
    await world.heartbeats.close()


async def test_a_cordon_after_a_launch_records_the_launch_time_of_that_start(env: Any) -> None:
    """Explorer seed 1359: a warm pool returned an instance (its launch action) and a capacity reservation
    interruption cordoned it a moment later. The cordon recorded the LaunchTime EC2 gave before that start (a
    cached answer), so the return check took the start for one since the cordon, undid the cordon, and pods
    came back to the node before its end. A launch action reads its instance fresh: a start changed it."""
    world = World(settings(launch_ready_timeout_sec=900))
    world.kube.nodes[NODE]["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    before, after = launched(3600), launched(5)
    world.resolver.info, world.resolver.fresh_info = before, after
    world.resolver.on_fresh = lambda: setattr(world.resolver, "info", after)  # a fresh answer is cached

    started = world.receive(launch())
    assert started is not None
    assert (await world.run(started))[0] is Outcome.DONE
    interrupted = world.receive(spot())
    assert interrupted is not None
    outcome = await world.run(interrupted)
    record = CordonRecord.from_node(world.node())
    assert record is not None, (outcome, world.node())
    assert after.launch_time is not None
    assert record.launch_time == after.launch_time.isoformat()


async def test_an_event_joining_after_a_start_records_the_instance_as_it_is_now(env: Any) -> None:
    """Explorer seed 1181: a stop's drain, held by a budget, outlived the instance's start, and a Spot warning
    joined it. The record still held the LaunchTime from before the stop, so once the drain ended the return
    check took the start for a return since the cordon and gave the node back; its pods were lost when the
    instance went. A joining event is a new interruption: the record follows the instance's start."""
    world = World(settings())
    before, after = launched(3600), launched(5)
    world.resolver.info = before
    operation = world.receive(stopped())
    assert operation is not None

    async def started_then_warned(name: str) -> None:
        if name == "web-1":
            world.resolver.fresh_info = after  # started again meanwhile
            assert world.receive(spot()) is None  # joins the running operation
            await asyncio.sleep(0.05)  # the join is taken up while the drain runs

    world.kube.on_evict = started_then_warned
    await world.run(operation)
    record = CordonRecord.from_node(world.node())
    assert record is not None
    assert after.launch_time is not None
    assert record.launch_time == after.launch_time.isoformat()


async def test_a_spot_warning_that_joins_while_we_stay_on_our_drained_node_bounds_the_stay(env: Any) -> None:
    """Explorer seed 2345: our own node was drained and we stayed for the other drains here, bounded by the drain
    deadline as it was then; a Spot warning for our instance joined meanwhile, and its end came before that bound:
    our pod went with the instance. The stay is bounded by what the operation's events say now."""
    world = World(settings(pod_name="qp-0", pod_namespace="apps"))
    world.kube.add_pod("qp-0")
    world.drainer.options = DrainOptions(own_pod=("apps", "qp-0"))
    world.handler._running += 1  # another drain runs here for the whole test: we stay for it
    operation = world.receive(rebalance())
    assert operation is not None
    with structlog.testing.capture_logs() as logs:
        leaving = asyncio.create_task(world.handler.handle(operation))
        await until(lambda: any(str(e["event"]).startswith("our own node is drained: staying") for e in logs))
        assert "qp-0" not in world.kube.evicted
        world.receive(spot("m-late", age_s=115))  # its notice ends in 5 s: sooner than LEAVE_LEAD_S
        try:
            await asyncio.wait_for(until(lambda: "qp-0" in world.kube.evicted), 30)
        finally:
            await rest.stop(leaving)
    assert sorted(world.kube.evicted) == ["qp-0", "web-0", "web-1", "web-2"]
    await world.heartbeats.close()
