"""Instance → node: EC2 DescribeInstances (batched, cached), the managed-tag check, and the Node lookup (by
PrivateDnsName, then the ``kubernetes.io/hostname`` label; or, with USE_PROVIDER_ID, ``spec.providerID``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from queue_processor import rest
from queue_processor.aws import collect
from queue_processor.kube import KubeClient

if TYPE_CHECKING:
    from types_aiobotocore_ec2 import EC2Client


@dataclass(frozen=True)
class InstanceInfo:
    """What EC2 says of an instance (DescribeInstances); ``launch_time`` is when it was last launched or
    started (aware; ``None`` when EC2 did not say)."""

    instance_id: str
    private_dns_name: str
    availability_zone: str
    state: str
    tags: dict[str, str] = field(default_factory=dict)
    instance_type: str = ""
    launch_time: datetime | None = None

    @property
    def provider_id(self) -> str:
        """``aws:///<az>/<instance-id>``: the Node's spec.providerID on AWS."""
        return f"aws:///{self.availability_zone}/{self.instance_id}"


def node_ready(node: dict[str, Any]) -> bool:
    """Whether a Node's ``Ready`` condition is ``True`` (its kubelet reports it healthy)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_managed(info: InstanceInfo, *, check: bool, tag: str, value: str = "") -> bool:
    """Whether the controller may act on the instance: ``check`` off, or it carries ``tag`` (= ``value``)."""
    return not check or (tag in info.tags and (not value or info.tags[tag] == value))


Describe = Callable[[list[str]], Awaitable[list[dict[str, Any]]]]


def _instances(page: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for reservation in page.get("Reservations") or []:
        for instance in reservation.get("Instances") or []:
            yield dict(instance)


async def describe_instances(ec2: EC2Client, instance_ids: list[str]) -> list[dict[str, Any]]:
    """EC2 DescribeInstances of ``instance_ids`` by an ``instance-id`` filter (``InstanceIds`` would fail them all
    with ``InvalidInstanceID.NotFound``), retried as a whole. Raises the AWS error after retries or if not retryable."""
    return await collect(
        lambda: ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-id", "Values": instance_ids}]
        ),
        _instances,
    )


#: Tags per page of the tagged-instances listing (DescribeTags ``MaxResults``: 5 to 1,000).
TAGGED_PAGE_SIZE = 1000


async def tagged_instances(ec2: EC2Client, tag: str) -> set[str]:
    """The IDs of every instance carrying the tag key ``tag`` (NTH's ``nth_tagged_instances``), from EC2 DescribeTags
    (lighter than NTH's DescribeInstances). Raises the AWS error after retries or if not retryable."""
    ids = await collect(
        lambda: ec2.get_paginator("describe_tags").paginate(
            Filters=[
                {"Name": "resource-type", "Values": ["instance"]},
                {"Name": "key", "Values": [tag]},
            ],
            PaginationConfig={"PageSize": TAGGED_PAGE_SIZE},
        ),
        lambda page: (str(item["ResourceId"]) for item in page.get("Tags") or []),
    )
    return set(ids)


def tagged_nodes(nodes: list[dict[str, Any]], instance_ids: set[str]) -> int:
    """How many ``nodes`` run one of ``instance_ids`` by ``spec.providerID``, as NTH counts them."""
    count = 0
    for node in nodes:
        parts = str((node.get("spec") or {}).get("providerID") or "").split("/")
        if len(parts) == 5 and parts[4].startswith("i-") and parts[4] in instance_ids:
            count += 1
    return count


class InstanceResolver:
    """Batched, cached DescribeInstances (``describe``: one call for a list of IDs): IDs asked within ``window_s``
    seconds go in one call of at most ``max_batch``, ``concurrency`` calls at once; answers cached ``ttl_s`` seconds."""

    def __init__(
        self,
        describe: Describe,
        *,
        window_s: float = 0.02,
        ttl_s: float = 60.0,
        max_batch: int = 200,
        concurrency: int = 1,
    ) -> None:
        self._describe = describe
        self.window_s = window_s
        self.ttl_s = ttl_s
        self.max_batch = max_batch
        self._cache: dict[str, tuple[float, InstanceInfo | None]] = {}
        self._waiting: dict[str, list[asyncio.Future[InstanceInfo | None]]] = {}
        self._flush: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(concurrency)
        self._in_flight: set[asyncio.Task[None]] = set()
        self.calls = 0
        """DescribeInstances calls made (tests and benchmarks read it)."""

    async def get(self, instance_id: str, *, fresh: bool = False) -> InstanceInfo | None:
        """The instance, ``None`` when EC2 does not know it; ``fresh`` skips the cache. Raises as ``describe``."""
        return (await self.get_many([instance_id], fresh=fresh))[0]

    async def get_many(
        self, instance_ids: Sequence[str], *, fresh: bool = False
    ) -> list[InstanceInfo | None]:
        """:meth:`get` of each of ``instance_ids``, in order, without a task each (callers ask for thousands):
        answered from the cache (unless ``fresh``), else by the next batch."""
        now = time.monotonic()
        futures: list[asyncio.Future[InstanceInfo | None]] = []
        for instance_id in instance_ids:
            future: asyncio.Future[InstanceInfo | None] = asyncio.get_running_loop().create_future()
            cached = self._cache.get(instance_id)
            if not fresh and cached is not None and cached[0] > now:
                future.set_result(cached[1])
            else:
                self._waiting.setdefault(instance_id, []).append(future)
            futures.append(future)
        if self._waiting and (self._flush is None or self._flush.done()):
            self._flush = rest.spawn(self._run_batch(), name="describe-instances")
        return list(await asyncio.gather(*futures))

    async def close(self) -> None:
        """Cancel a pending batch and the calls under way (their waiters get ``CancelledError``)."""
        await rest.stop(self._flush, *self._in_flight)

    async def _run_batch(self) -> None:
        await asyncio.sleep(self.window_s)
        while self._waiting:
            await self._slots.acquire()
            ids = list(self._waiting)[: self.max_batch]
            if not ids:
                self._slots.release()
                return
            waiters = {instance_id: self._waiting.pop(instance_id) for instance_id in ids}
            task = asyncio.create_task(self._call(waiters), name="describe-instances-call")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _call(self, waiters: dict[str, list[asyncio.Future[InstanceInfo | None]]]) -> None:
        try:
            try:
                found = {info.instance_id: info for info in map(_info, await self._describe(list(waiters)))}
            except BaseException as exc:
                error = exc if isinstance(exc, Exception) else asyncio.CancelledError()
                for future in (future for futures in waiters.values() for future in futures):
                    if not future.done():
                        future.set_exception(error)
                if not isinstance(exc, Exception):
                    raise
                return
            self.calls += 1
            expiry = time.monotonic() + self.ttl_s
            for instance_id, futures in waiters.items():
                info = found.get(instance_id)
                self._cache[instance_id] = (expiry, info)
                for future in futures:
                    if not future.done():
                        future.set_result(info)
        finally:
            self._slots.release()


def _info(instance: dict[str, Any]) -> InstanceInfo:
    launched = instance.get("LaunchTime")
    return InstanceInfo(
        instance_id=instance["InstanceId"],
        private_dns_name=instance.get("PrivateDnsName") or "",
        availability_zone=(instance.get("Placement") or {}).get("AvailabilityZone", ""),
        state=(instance.get("State") or {}).get("Name", ""),
        tags={tag["Key"]: tag.get("Value", "") for tag in instance.get("Tags") or []},
        instance_type=instance.get("InstanceType") or "",
        # botocore's LaunchTime is a datetime, aware (UTC when naive).
        launch_time=launched.replace(tzinfo=launched.tzinfo or UTC)
        if isinstance(launched, datetime)
        else None,
    )


class NodeFinder:
    """Finds the Node of an instance (see the module docstring). The providerID index (one cached node LIST) is
    rebuilt when older than 30 seconds, or after a miss when older than 2."""

    def __init__(self, kube: KubeClient, *, use_provider_id: bool) -> None:
        self.kube = kube
        self.use_provider_id = use_provider_id
        self._by_provider: dict[str, str] = {}
        self._indexed_at = -1e18
        self._index_lock = asyncio.Lock()

    async def find(self, info: InstanceInfo) -> dict[str, Any] | None:
        """The Node (a dict), or ``None`` when the cluster has none for the instance."""
        if self.use_provider_id:
            return await self._by_provider_id(info)
        if info.private_dns_name:
            node = await self.kube.get_node(info.private_dns_name)
            if node is not None:
                return node
            short = info.private_dns_name.split(".")[0]
            nodes = await self.kube.list_nodes(f"kubernetes.io/hostname in ({info.private_dns_name},{short})")
            if nodes:
                return nodes[0]
        return None

    async def _by_provider_id(self, info: InstanceInfo) -> dict[str, Any] | None:
        name = await self._provider_name(info, refresh=False)
        if name is None:
            name = await self._provider_name(info, refresh=True)
        return await self.kube.get_node(name) if name is not None else None

    async def _provider_name(self, info: InstanceInfo, *, refresh: bool) -> str | None:
        async with self._index_lock:
            age = time.monotonic() - self._indexed_at
            if age > 30.0 or (refresh and age > 2.0):
                nodes = await self.kube.list_nodes(cached=True)
                self._by_provider = {
                    (n.get("spec") or {}).get("providerID", ""): n["metadata"]["name"] for n in nodes
                }
                self._indexed_at = time.monotonic()
        name = self._by_provider.get(info.provider_id)
        if name is None:  # some providers omit the zone: aws:///<instance-id>
            name = next((n for p, n in self._by_provider.items() if p.endswith("/" + info.instance_id)), None)
        return name
