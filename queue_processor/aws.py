"""The controller's AWS clients (aiobotocore); botocore's retries are off and :func:`call` retries instead
("Error retries and exponential backoff in AWS", AWS General Reference). Other errors reach the caller at once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.loaders import JSONFileLoader, Loader
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from queue_processor.config import Settings
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import AwsResult
from queue_processor.permissions import AWS_API_CALLS

if TYPE_CHECKING:  # the stubs are a development dependency
    from types_aiobotocore_autoscaling import AutoScalingClient
    from types_aiobotocore_ec2 import EC2Client
    from types_aiobotocore_sqs import SQSClient

T = TypeVar("T")
U = TypeVar("U")

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
    """Whether Auto Scaling answered ``ValidationError: No active Lifecycle Action found…``: the lifecycle
    action is already over (terminal, never retried)."""
    return error_code(exc) == "ValidationError" and "No active Lifecycle Action" in str(exc)


#: Attempts per AWS call, the first included.
ATTEMPTS = 5


def _retrying() -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(is_retryable),
        wait=wait_random_exponential(multiplier=0.2, max=5),
        stop=stop_after_attempt(ATTEMPTS),
        reraise=True,
    )


async def call(fn: Callable[..., Awaitable[T]], /, **kwargs: Any) -> T:
    """``await fn(**kwargs)``, retried while :func:`is_retryable` (jittered backoff up to 0.2 s * 2^n, at most
    5 s between attempts, :data:`ATTEMPTS` in all); raises the last error, or a non-retryable one at once."""
    async for attempt in _retrying():
        with attempt:
            return await fn(**kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


async def collect(pages: Callable[[], AsyncIterator[T]], pick: Callable[[T], Iterable[U]], /) -> list[U]:
    """What ``pick`` takes from each page of ``pages()`` (fresh, one held at a time), retried like :func:`call`."""
    async for attempt in _retrying():
        with attempt:
            return [item async for page in pages() for item in pick(page)]
    raise AssertionError("unreachable")  # pragma: no cover


class _CallCounter:
    """botocore ``after-call``/``after-call-error`` handlers reporting each request of one client's
    ``service`` to an :class:`~queue_processor.observe.metrics.Observer`."""

    def __init__(self, service: str, observer: Observer) -> None:
        self.service = service
        self.observer = observer

    def answered(self, http_response: Any, parsed: Mapping[str, Any], model: Any, **_: Any) -> None:
        """An answer came (botocore's ``after-call`` event)."""
        result: AwsResult = "ok"
        if int(getattr(http_response, "status_code", 0)) >= 300:
            code = str((parsed.get("Error") or {}).get("Code", ""))
            result = "throttled" if code in THROTTLING else "error"
        self.observer.aws_request(self.service, str(model.name), result)

    def failed(self, event_name: str, **_: Any) -> None:
        """No answer came (botocore's ``after-call-error.<service-id>.<Operation>`` event)."""
        self.observer.aws_request(self.service, event_name.rsplit(".", 1)[-1], "error")


def _shapes_reached(shapes: Mapping[str, Any], roots: Iterable[str]) -> set[str]:
    """The names of ``roots`` and of every shape they reach."""
    seen: set[str] = set()
    todo = [name for name in roots if name]
    while todo:
        name = todo.pop()
        if name in seen or name not in shapes:
            continue
        seen.add(name)
        shape = shapes[name]
        refs = [member.get("shape") for member in (shape.get("members") or {}).values()]
        refs += [(shape.get(part) or {}).get("shape") for part in ("member", "key", "value")]
        todo += [ref for ref in refs if ref]
    return seen


def _undocumented(value: Any) -> Any:
    """``value`` (a JSON tree) without its ``documentation`` strings."""
    if isinstance(value, dict):
        return {key: _undocumented(item) for key, item in value.items() if key != "documentation"}
    if isinstance(value, list):
        return [_undocumented(item) for item in value]
    return value


def trim_service_model(model: Mapping[str, Any], operations: Iterable[str]) -> dict[str, Any]:
    """A botocore service model (``service-2.json``) with only ``operations`` and the shapes they reach,
    without documentation strings. A client built on it raises ``AttributeError`` for any other method."""
    kept = {name: model["operations"][name] for name in operations if name in model.get("operations", {})}
    shapes = model.get("shapes") or {}
    roots = [
        ref.get("shape")
        for operation in kept.values()
        for ref in (operation.get("input") or {}, operation.get("output") or {}, *operation.get("errors", ()))
    ]
    reached = _shapes_reached(shapes, roots)
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
    """botocore's JSON file loader trimming the models of ``calls`` (service → operations) and the endpoints data,
    which are kept for the life of the process (docs/benchmarks.md, "Memory, profiled")."""

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
    """SQS, EC2 and Auto Scaling clients for ``AWS_REGION`` (and ``AWS_ENDPOINT`` when set), opened by
    ``async with``; ``observer`` is told every HTTP request each client makes."""

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
            counter = _CallCounter(client.meta.service_model.service_name, self.observer)
            client.meta.events.register("after-call", counter.answered)
            client.meta.events.register("after-call-error", counter.failed)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
