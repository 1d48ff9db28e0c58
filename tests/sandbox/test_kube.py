"""The Kubernetes API emulation, driven through the real ``kubernetes`` client over HTTP.

These are the contract the controller's tests rely on: selectors, patches, graceful deletion, eviction
with PodDisruptionBudget arithmetic, Leases with conflicts, simulated controllers, request counts, faults.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from queue_processor.sandbox.clock import SandboxClock
from queue_processor.sandbox.kube import KubeSandbox

SCALE = 0.01  # 1 simulated second = 10 ms


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeSandbox]:
    with KubeSandbox(SandboxClock(SCALE), cache_lag_s=50.0) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def api(kube: KubeSandbox, tmp_path_factory: pytest.TempPathFactory) -> client.ApiClient:
    path = kube.kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")
    return config.new_client_from_config(str(path))


@pytest.fixture
def v1(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def nodes(kube: KubeSandbox, count: int, **labels: str) -> list[str]:
    names = [unique("ip-10-0-0") + ".ec2.internal" for _ in range(count)]
    for index, name in enumerate(names):
        kube.add_node(name, provider_id=f"aws:///us-east-1a/i-{index:017x}", labels=labels)
    wait_for(lambda: all(kube.get("nodes", name) is not None for name in names))
    wait_for(lambda: all(_ready(kube.get("nodes", name)) for name in names))
    return names


def _ready(node: dict | None) -> bool:  # type: ignore[type-arg]
    return bool(node) and any(
        c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
    )  # type: ignore[index]


def evict(v1: client.CoreV1Api, namespace: str, name: str, grace: int | None = None) -> None:
    options = client.V1DeleteOptions(grace_period_seconds=grace) if grace is not None else None
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace), delete_options=options
    )
    v1.create_namespaced_pod_eviction(name, namespace, body)


# --------------------------------------------------------------------------------------------------- nodes


def test_nodes_list_by_label_and_read(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    group = unique("pool")
    names = nodes(kube, 3, pool=group)
    listed = v1.list_node(label_selector=f"pool={group}").items
    assert sorted(node.metadata.name for node in listed) == sorted(names)
    assert v1.list_node(label_selector=f"pool in ({group}, other),!missing").items
    others = {node.metadata.name for node in v1.list_node(label_selector=f"pool!={group}").items}
    assert others.isdisjoint(names)
    assert others == {n.metadata.name for n in v1.list_node().items} - set(names)
    node = v1.read_node(names[0])
    assert node.spec.provider_id.startswith("aws:///us-east-1a/i-")
    assert node.metadata.labels["kubernetes.io/hostname"] == names[0]
    by_name = v1.list_node(field_selector=f"metadata.name={names[1]}").items
    assert [n.metadata.name for n in by_name] == [names[1]]


def test_cordon_and_taints_merge_by_key_with_strategic_merge_patch(
    kube: KubeSandbox, v1: client.CoreV1Api
) -> None:
    (name,) = nodes(kube, 1)
    v1.patch_node(name, {"spec": {"unschedulable": True}})
    v1.patch_node(name, {"spec": {"taints": [{"key": "a", "value": "1", "effect": "NoSchedule"}]}})
    v1.patch_node(name, {"spec": {"taints": [{"key": "b", "value": "2", "effect": "NoExecute"}]}})
    v1.patch_node(name, {"spec": {"taints": [{"key": "a", "value": "3", "effect": "NoSchedule"}]}})
    node = v1.read_node(name)
    assert node.spec.unschedulable is True
    assert {(t.key, t.value, t.effect) for t in node.spec.taints} == {
        ("a", "3", "NoSchedule"),
        ("b", "2", "NoExecute"),
    }
    v1.patch_node(name, {"spec": {"taints": [{"key": "a", "$patch": "delete"}]}})
    assert [t.key for t in v1.read_node(name).spec.taints] == ["b"]


def test_json_patch_and_merge_patch(kube: KubeSandbox, api: client.ApiClient, v1: client.CoreV1Api) -> None:
    (name,) = nodes(kube, 1)
    v1.patch_node(name, [{"op": "add", "path": "/metadata/labels/team", "value": "a"}])
    assert v1.read_node(name).metadata.labels["team"] == "a"
    # A JSON merge patch sent by hand: null removes the label.
    api.call_api(
        *api.param_serialize(
            "PATCH",
            f"/api/v1/nodes/{name}",
            header_params={"Content-Type": "application/merge-patch+json"},
            body={"metadata": {"labels": {"team": None}}},
        )
    ).read()
    assert "team" not in v1.read_node(name).metadata.labels
    with pytest.raises(client.ApiException) as failed:
        v1.patch_node(name, [{"op": "remove", "path": "/metadata/labels/absent"}])
    assert failed.value.status == 422


def test_missing_objects_are_404_with_a_status(v1: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as missing:
        v1.read_node("no-such-node")
    assert missing.value.status == 404
    assert '"reason": "NotFound"' in missing.value.body


def test_a_node_registers_and_turns_ready_after_its_delays(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    name = unique("late")
    kube.add_node(name, register_after_s=20, ready_after_s=20)  # 0.2 s, then 0.2 s more
    with pytest.raises(client.ApiException):
        v1.read_node(name)
    wait_for(lambda: kube.get("nodes", name) is not None)
    assert not _ready(kube.get("nodes", name))
    wait_for(lambda: _ready(kube.get("nodes", name)))


# ---------------------------------------------------------------------------------------------------- pods


def test_pods_by_node_and_selectors(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    names = nodes(kube, 2)
    namespace = unique("ns")
    kube.add_replicaset(namespace, "web", nodes=names, replicas=4, labels={"app": "web", "tier": "front"})
    kube.add_pod(namespace, "solo", node=names[0], labels={"app": "solo"})
    on_first = v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={names[0]}").items
    assert sorted(p.metadata.name for p in on_first) == ["solo", "web-00000", "web-00002"]
    in_ns = v1.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={names[1]},status.phase=Running")
    assert sorted(p.metadata.name for p in in_ns.items) == ["web-00001", "web-00003"]
    web = v1.list_namespaced_pod(namespace, label_selector="app=web,tier in (front)").items
    assert len(web) == 4
    assert [
        p.metadata.name for p in v1.list_namespaced_pod(namespace, label_selector="app notin (web)").items
    ] == ["solo"]
    with pytest.raises(client.ApiException) as bad:
        v1.list_namespaced_pod(namespace, field_selector="spec.schedulerName=x")
    assert bad.value.status == 400


def test_resource_version_zero_may_be_stale(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    (name,) = nodes(kube, 1)
    namespace = unique("ns")
    v1.list_pod_for_all_namespaces(resource_version="0")  # fills the cache
    kube.add_pod(namespace, "fresh", node=name)
    quorum = v1.list_namespaced_pod(namespace).items
    cached = v1.list_namespaced_pod(namespace, resource_version="0").items
    assert [p.metadata.name for p in quorum] == ["fresh"]
    assert cached == []  # the cache lags by 50 simulated seconds = 0.5 s
    wait_for(lambda: bool(v1.list_namespaced_pod(namespace, resource_version="0").items))


def test_graceful_deletion_keeps_the_pod_until_its_grace_period_has_passed(
    kube: KubeSandbox, v1: client.CoreV1Api
) -> None:
    (name,) = nodes(kube, 1)
    namespace = unique("ns")
    kube.add_pod(namespace, "slow", node=name, grace_s=30)
    kube.add_pod(namespace, "quick", node=name, grace_s=30)
    kube.add_pod(namespace, "now", node=name, grace_s=30)
    started = time.monotonic()
    v1.delete_namespaced_pod("slow", namespace)  # its own 30 s = 0.3 s
    v1.delete_namespaced_pod("quick", namespace, grace_period_seconds=5)
    v1.delete_namespaced_pod("now", namespace, grace_period_seconds=0)
    slow = v1.read_namespaced_pod("slow", namespace)
    assert slow.metadata.deletion_timestamp is not None
    assert slow.metadata.deletion_grace_period_seconds == 30
    assert "now" not in {p.metadata.name for p in v1.list_namespaced_pod(namespace).items}
    wait_for(lambda: kube.get("pods", "quick", namespace) is None)
    assert kube.get("pods", "slow", namespace) is not None
    wait_for(lambda: kube.get("pods", "slow", namespace) is None)
    assert time.monotonic() - started >= 0.3 * 0.9


# ----------------------------------------------------------------------------------------------- evictions


def test_eviction_honours_a_pod_disruption_budget(
    kube: KubeSandbox, v1: client.CoreV1Api, api: client.ApiClient
) -> None:
    names = nodes(kube, 3)
    namespace = unique("ns")
    kube.add_replicaset(namespace, "web", nodes=names, replicas=3, labels={"app": "web"}, grace_s=10)
    kube.add_pdb(namespace, "web", match_labels={"app": "web"}, min_available=2)
    budget = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("web", namespace).status
    assert (budget.current_healthy, budget.desired_healthy, budget.disruptions_allowed) == (3, 2, 1)
    evict(v1, namespace, "web-00000")
    with pytest.raises(client.ApiException) as refused:
        evict(v1, namespace, "web-00001")
    assert refused.value.status == 429
    assert "would violate the pod's disruption budget" in refused.value.body
    assert "needs 2 healthy pods and has 2 currently" in refused.value.body
    # The ReplicaSet replaces the evicted pod; once the replacement is Ready, the next eviction goes through.
    wait_for(
        lambda: (
            client.PolicyV1Api(api)
            .read_namespaced_pod_disruption_budget("web", namespace)
            .status.disruptions_allowed
            == 1
        )
    )
    evict(v1, namespace, "web-00001")
    assert [
        pod["metadata"]["name"] for pod in kube.evictions if pod["metadata"]["namespace"] == namespace
    ] == [
        "web-00000",
        "web-00001",
    ]


def test_eviction_with_two_budgets_is_500_and_a_missing_pod_404(
    kube: KubeSandbox, v1: client.CoreV1Api
) -> None:
    (name,) = nodes(kube, 1)
    namespace = unique("ns")
    kube.add_pod(namespace, "shared", node=name, labels={"app": "x", "team": "y"})
    kube.add_pdb(namespace, "by-app", match_labels={"app": "x"}, max_unavailable=1)
    kube.add_pdb(namespace, "by-team", match_labels={"team": "y"}, max_unavailable=1)
    with pytest.raises(client.ApiException) as both:
        evict(v1, namespace, "shared")
    assert both.value.status == 500
    assert "more than one PodDisruptionBudget" in both.value.body
    with pytest.raises(client.ApiException) as missing:
        evict(v1, namespace, "ghost")
    assert missing.value.status == 404


def test_pending_and_terminating_pods_bypass_the_budget(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    (name,) = nodes(kube, 1)
    namespace = unique("ns")
    kube.add_pod(namespace, "pending", node=name, labels={"app": "p"}, phase="Pending")
    kube.add_pod(namespace, "running", node=name, labels={"app": "p"}, grace_s=60)
    kube.add_pdb(namespace, "all", match_labels={"app": "p"}, min_available="100%")
    evict(v1, namespace, "pending")
    with pytest.raises(client.ApiException) as refused:
        evict(v1, namespace, "running")
    assert refused.value.status == 429
    v1.delete_namespaced_pod("running", namespace)  # now terminating
    evict(v1, namespace, "running", grace=0)  # a terminating pod is evicted without a budget check
    wait_for(lambda: kube.get("pods", "running", namespace) is None, timeout_s=1.0)


def test_max_unavailable_percentage(kube: KubeSandbox, v1: client.CoreV1Api, api: client.ApiClient) -> None:
    names = nodes(kube, 2)
    namespace = unique("ns")
    kube.add_replicaset(namespace, "api", nodes=names, replicas=10, labels={"app": "api"}, grace_s=100)
    kube.add_pdb(namespace, "api", match_labels={"app": "api"}, max_unavailable="25%")  # ceil(2.5) = 3
    status = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("api", namespace).status
    assert (status.expected_pods, status.desired_healthy, status.disruptions_allowed) == (10, 7, 3)


# ------------------------------------------------------------------------------------- simulated controllers


def test_daemonset_pods_follow_nodes_and_come_back(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    namespace = unique("ns")
    kube.add_daemonset(namespace, "agent", labels={"app": "agent"})
    (late,) = nodes(kube, 1)
    wait_for(lambda: any(p.spec.node_name == late for p in v1.list_namespaced_pod(namespace).items))
    pod = next(p for p in v1.list_namespaced_pod(namespace).items if p.spec.node_name == late)
    assert pod.metadata.owner_references[0].kind == "DaemonSet"
    v1.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_for(lambda: kube.get("pods", pod.metadata.name, namespace) is not None)


def test_replacements_avoid_cordoned_nodes(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    names = nodes(kube, 2)
    namespace = unique("ns")
    kube.add_replicaset(namespace, "web", nodes=[names[0]], replicas=2, labels={"app": "web"}, grace_s=1)
    v1.patch_node(names[0], {"spec": {"unschedulable": True}})
    for pod in ("web-00000", "web-00001"):
        evict(v1, namespace, pod)
    wait_for(
        lambda: (
            len(
                [
                    p
                    for p in v1.list_namespaced_pod(namespace).items
                    if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                ]
            )
            == 2
        )
    )
    placed = {p.spec.node_name for p in v1.list_namespaced_pod(namespace).items}
    assert names[0] not in placed  # the sandbox has other tests' nodes too: any but the cordoned one
    assert placed


def test_deleting_a_node_removes_its_pods(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    (name,) = nodes(kube, 1)
    namespace = unique("ns")
    kube.add_pod(namespace, "gone", node=name)
    kube.delete_node(name)
    assert kube.get("nodes", name) is None
    assert v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items == []


# ------------------------------------------------------------------------------------------ leases, events


def test_leases_conflict_on_a_stale_resource_version(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    namespace, name = unique("ns"), unique("node-lease")
    created = leases.create_namespaced_lease(
        namespace,
        client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=client.V1LeaseSpec(holder_identity="a")),
    )
    with pytest.raises(client.ApiException) as exists:
        leases.create_namespaced_lease(namespace, client.V1Lease(metadata=client.V1ObjectMeta(name=name)))
    assert exists.value.status == 409
    assert '"reason": "AlreadyExists"' in exists.value.body
    created.spec.holder_identity = "b"
    updated = leases.replace_namespaced_lease(name, namespace, created)
    assert updated.metadata.resource_version != created.metadata.resource_version
    created.spec.holder_identity = "c"  # still carries the old resourceVersion
    with pytest.raises(client.ApiException) as stale:
        leases.replace_namespaced_lease(name, namespace, created)
    assert stale.value.status == 409
    assert '"reason": "Conflict"' in stale.value.body
    assert leases.read_namespaced_lease(name, namespace).spec.holder_identity == "b"


def test_events_can_be_created(v1: client.CoreV1Api) -> None:
    namespace = unique("ns")
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="node-"),
        involved_object=client.V1ObjectReference(kind="Node", name="n1"),
        reason="Cordon",
        message="cordoned for spot-interruption",
        type="Normal",
    )
    created = v1.create_namespaced_event(namespace, event)
    assert created.metadata.name.startswith("node-")
    assert [e.reason for e in v1.list_namespaced_event(namespace).items] == ["Cordon"]


# ------------------------------------------------------------------------------------- counting and faults


def test_requests_are_counted_by_verb_and_resource(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    (name,) = nodes(kube, 1)
    before = kube.requests.copy()
    v1.read_node(name)
    v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
    v1.patch_node(name, {"spec": {"unschedulable": True}})
    delta = kube.requests - before
    assert delta == {"get nodes": 1, "list pods": 1, "patch nodes": 1}


def test_injected_faults(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    (name,) = nodes(kube, 1)
    kube.inject_fault("get", "nodes", status=429, count=2)
    for _ in range(2):
        with pytest.raises(client.ApiException) as throttled:
            v1.read_node(name)
        assert throttled.value.status == 429
    assert v1.read_node(name).metadata.name == name
    # With Retry-After, urllib3 (under the kubernetes client) waits and retries a 429 by itself.
    fault = kube.inject_fault("get", "nodes", status=429, count=1, retry_after_s=1)
    started = time.monotonic()
    assert v1.read_node(name).metadata.name == name
    assert fault.count == 0
    assert time.monotonic() - started >= 0.9
    kube.inject_fault("patch", "nodes", status=500)
    with pytest.raises(client.ApiException) as broken:
        v1.patch_node(name, {"spec": {"unschedulable": True}})
    assert broken.value.status == 500
    # A hung API server: urllib3 retries a timed-out GET three times, then the call fails.
    hang = kube.inject_fault("list", "pods", delay_s=1.0, count=4)
    with pytest.raises(Exception, match=r"(?i)timed? ?out"):
        v1.list_pod_for_all_namespaces(_request_timeout=0.2)
    assert hang.count == 0


def test_kubeconfig_points_at_the_server(kube: KubeSandbox, tmp_path: Path) -> None:
    path = kube.kubeconfig(tmp_path / "config")
    loaded = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=loaded)
    assert loaded.host == kube.url


def test_pdb_status_kept_by_counters_equals_a_full_scan(kube: KubeSandbox, v1: client.CoreV1Api) -> None:
    # The sandbox keeps a one-label budget's status with counters updated on every pod change (a storm of
    # evictions would otherwise scan every pod of the app each time); it must say what a scan says.
    from queue_processor.sandbox.kube_logic import is_terminating, pdb_status

    hosts = nodes(kube, 3)
    namespace = unique("pdb")
    app = {"app": unique("web")}
    kube.add_replicaset(namespace, app["app"], nodes=hosts, replicas=6, labels=app, grace_s=30)
    kube.add_pod(namespace, unique("bare"), node=hosts[0], labels=app)  # unreplicated: counts as itself
    kube.add_pdb(namespace, app["app"], match_labels=app, max_unavailable=2)
    pdb_key = (namespace, app["app"])

    def both() -> tuple[dict, dict]:  # type: ignore[type-arg]
        with kube.lock:
            pdb = kube._objects["poddisruptionbudgets"][pdb_key]
            fast = kube._pdb_status(pdb)
            pods = kube._select_pods(namespace, pdb["spec"]["selector"])
            live = [p for p in pods if not is_terminating(p)]
            return fast, pdb_status(pdb, pods, kube._expected_pods(live or pods))

    fast, scanned = both()
    assert fast == scanned
    assert fast["expectedPods"] == 7
    for name in [f"{app['app']}-00000", f"{app['app']}-00001"]:
        evict(v1, namespace, name)  # terminating for 30 s, replacements scheduled
        fast, scanned = both()
        assert fast == scanned
    assert fast["disruptionsAllowed"] == 0
