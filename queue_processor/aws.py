"""The controller's AWS clients (aiobotocore), retried by :func:`call`, not botocore ("Error retries and exponential
backoff in AWS", AWS General Reference); EC2's DescribeInstances batched and cached, and the managed-tag check."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.loaders import JSONFileLoader, Loader
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from queue_processor import rest
from queue_processor.config import Settings
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import AwsResult
from queue_processor.permissions import AWS_API_CALLS

if TYPE_CHECKING:  # the stubs are a development dependency
    from types_aiobotocore_autoscaling import AutoScalingClient
    from types_aiobotocore_ec2 import EC2Client
    from types_aiobotocore_sqs import SQSClient

T = TypeVar("T")

#: Error codes AWS uses for throttling (botocore's standard retry mode lists the same family).
THROTTLING = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ``ClientError`` (``""`` for anything else)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def is_retryable(exc: BaseException) -> bool:
    """Throttling, a 5xx answer, or a connection/timeout error: worth another attempt."""
    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return error_code(exc) in THROTTLING or status >= 500
    return isinstance(exc, BotoConnectionError | aiohttp.ClientError | TimeoutError | BotoCoreError)


def is_no_active_action(exc: BaseException) -> bool:
    """Whether Auto Scaling answered ``ValidationError: No active Lifecycle Action found…`` (over; never retried)."""
    return error_code(exc) == "ValidationError" and "No active Lifecycle Action" in str(exc)


#: Attempts per AWS call, the first included.
ATTEMPTS = 5


async def call(fn: Callable[..., Awaitable[T]], /, **kwargs: Any) -> T:
    """``await fn(**kwargs)``, retried while :func:`is_retryable` (jittered backoff up to 0.2 s * 2^n, at most
    5 s between attempts, :data:`ATTEMPTS` in all); raises the last error, or a non-retryable one at once."""
    retrying = AsyncRetrying(
        retry=retry_if_exception(is_retryable),
        wait=wait_random_exponential(multiplier=0.2, max=5),
        stop=stop_after_attempt(ATTEMPTS),
        reraise=True,
    )
    async for attempt in retrying:  # not retrying(fn): botocore's client methods are not coroutine functions
        with attempt:
            return await fn(**kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


def _count_requests(client: Any, observer: Observer) -> None:
    """Report each HTTP request of ``client`` to ``observer`` (botocore's ``after-call`` and ``after-call-error``)."""
    service = str(client.meta.service_model.service_name)

    def answered(http_response: Any, parsed: Mapping[str, Any], model: Any, **_: Any) -> None:
        result: AwsResult = "ok"
        if int(getattr(http_response, "status_code", 0)) >= 300:
            code = str((parsed.get("Error") or {}).get("Code", ""))
            result = "throttled" if code in THROTTLING else "error"
        observer.aws_request(service, str(model.name), result)

    def failed(event_name: str, **_: Any) -> None:
        observer.aws_request(service, event_name.rsplit(".", 1)[-1], "error")

    client.meta.events.register("after-call", answered)
    client.meta.events.register("after-call-error", failed)


def _undocumented(value: Any) -> Any:
    """``value`` (a JSON tree) without its ``documentation`` strings."""
    if isinstance(value, dict):
        return {key: _undocumented(item) for key, item in value.items() if key != "documentation"}
    if isinstance(value, list):
        return [_undocumented(item) for item in value]
    return value


def trim_service_model(model: Mapping[str, Any], operations: Iterable[str]) -> dict[str, Any]:
    """A ``service-2.json`` with only ``operations`` and the shapes they reach, undocumented; others: AttributeError."""
    kept = {name: model["operations"][name] for name in operations if name in model.get("operations", {})}
    shapes = model.get("shapes") or {}
    todo = [
        ref.get("shape")
        for operation in kept.values()
        for ref in (operation.get("input") or {}, operation.get("output") or {}, *operation.get("errors", ()))
    ]
    reached: set[str] = set()
    while todo:  # the shapes the operations name, and every shape those reach
        name = todo.pop()
        if not name or name in reached or name not in shapes:
            continue
        reached.add(name)
        shape = shapes[name]
        todo += [member.get("shape") for member in (shape.get("members") or {}).values()]
        todo += [(shape.get(part) or {}).get("shape") for part in ("member", "key", "value")]
    trimmed = {
        key: value for key, value in model.items() if key not in ("operations", "shapes", "documentation")
    }
    trimmed["operations"] = _undocumented(kept)
    trimmed["shapes"] = {name: _undocumented(shapes[name]) for name in sorted(reached)}
    return trimmed


def trim_endpoints(endpoints: Mapping[str, Any], services: Iterable[str]) -> dict[str, Any]:
    """botocore's ``endpoints.json`` with only ``services``' entries (endpoint prefixes) in each partition."""
    wanted = set(services)
    partitions = [
        {
            **partition,
            "services": {
                name: value for name, value in (partition.get("services") or {}).items() if name in wanted
            },
        }
        for partition in endpoints.get("partitions") or []
    ]
    return {**endpoints, "partitions": partitions}


class TrimmedModels(JSONFileLoader):
    """botocore's JSON loader trimming ``calls``' models (service → operations) and endpoints data, kept for life."""

    def __init__(self, calls: Mapping[str, Iterable[str]] = AWS_API_CALLS) -> None:
        self.calls = {service: tuple(operations) for service, operations in calls.items()}

    def load_file(self, file_path: str) -> Any:
        """The file's data, trimmed as the class says; ``None`` when there is no such file."""
        data = super().load_file(file_path)
        parts = file_path.replace("\\", "/").split("/")
        if data is None:
            return None
        if parts[-1] == "service-2" and len(parts) >= 3 and parts[-3] in self.calls:
            return trim_service_model(data, self.calls[parts[-3]])
        if parts[-1] == "endpoints":
            return trim_endpoints(data, self.calls)
        return data


class AwsClients:
    """SQS, EC2 and Auto Scaling clients (``async with``) for AWS_REGION (AWS_ENDPOINT); requests to ``observer``."""

    def __init__(self, settings: Settings, *, observer: Observer = NULL_OBSERVER) -> None:
        self.settings = settings
        self.observer = observer
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> AwsClients:
        session = get_session()
        session.register_component("data_loader", Loader(file_loader=TrimmedModels()))
        # SQS long polls take 20 s: the read timeout must exceed them. One attempt: `call` retries.
        config = AioConfig(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
            max_pool_connections=64,
        )
        region, endpoint = self.settings.aws_region, self.settings.aws_endpoint or None

        def open_client(name: Any) -> Awaitable[Any]:  # one of the services the stubs name
            made = session.create_client(name, region_name=region, endpoint_url=endpoint, config=config)
            return self._stack.enter_async_context(made)

        self.sqs: SQSClient = await open_client("sqs")
        self.ec2: EC2Client = await open_client("ec2")
        self.autoscaling: AutoScalingClient = await open_client("autoscaling")
        for client in (self.sqs, self.ec2, self.autoscaling):
            _count_requests(client, self.observer)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()


@dataclass(frozen=True)
class InstanceInfo:
    """What EC2 says of an instance (DescribeInstances); ``launch_time``: last launch or start (aware, or ``None``)."""

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


def is_managed(info: InstanceInfo, *, check: bool, tag: str, value: str = "") -> bool:
    """Whether the controller may act on the instance: ``check`` off, or it carries ``tag`` (= ``value``)."""
    return not check or (tag in info.tags and (not value or info.tags[tag] == value))


Describe = Callable[[list[str]], Awaitable[list[dict[str, Any]]]]


async def describe_instances(ec2: EC2Client, instance_ids: list[str]) -> list[dict[str, Any]]:
    """EC2 DescribeInstances of ``instance_ids`` by an ``instance-id`` filter (``InstanceIds`` would fail them all
    with ``InvalidInstanceID.NotFound``), retried as a whole. Raises the AWS error after retries or if not retryable."""

    async def read_pages() -> list[dict[str, Any]]:  # afresh on each attempt, one page held at a time
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-id", "Values": instance_ids}]
        )
        return [
            dict(instance)
            async for page in pages
            for reservation in page.get("Reservations") or []
            for instance in reservation.get("Instances") or []
        ]

    return await call(read_pages)


#: Tags per page of the tagged-instances listing (DescribeTags ``MaxResults``: 5 to 1,000).
TAGGED_PAGE_SIZE = 1000


async def tagged_instances(ec2: EC2Client, tag: str) -> set[str]:
    """The IDs of every instance carrying the tag key ``tag`` (NTH's ``nth_tagged_instances``), from EC2 DescribeTags
    (lighter than NTH's DescribeInstances). Raises the AWS error after retries or if not retryable."""

    async def read_pages() -> set[str]:
        pages = ec2.get_paginator("describe_tags").paginate(
            Filters=[{"Name": "resource-type", "Values": ["instance"]}, {"Name": "key", "Values": [tag]}],
            PaginationConfig={"PageSize": TAGGED_PAGE_SIZE},
        )
        return {str(item["ResourceId"]) async for page in pages for item in page.get("Tags") or []}

    return await call(read_pages)


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
        """:meth:`get` of each of ``instance_ids`` in order, no task each: cached (unless ``fresh``), else batched."""
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
            await self._slots.acquire()  # only get_many adds to _waiting meanwhile: the batch is never empty
            ids = list(self._waiting)[: self.max_batch]
            waiters = {instance_id: self._waiting.pop(instance_id) for instance_id in ids}
            task = asyncio.create_task(self._call(waiters), name="describe-instances-call")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _call(self, waiters: dict[str, list[asyncio.Future[InstanceInfo | None]]]) -> None:
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
        finally:
            self._slots.release()
        self.calls += 1
        expiry = time.monotonic() + self.ttl_s
        for instance_id, futures in waiters.items():
            info = found.get(instance_id)
            self._cache[instance_id] = (expiry, info)
            for future in futures:
                if not future.done():
                    future.set_result(info)


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
