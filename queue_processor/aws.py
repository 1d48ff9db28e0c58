"""The controller's AWS clients (aiobotocore) and how their calls are retried.

:class:`AwsClients` opens SQS, EC2 and Auto Scaling clients for ``AWS_REGION`` (and ``AWS_ENDPOINT`` when
set: the sandbox, or private endpoints). botocore's own retries are turned off; :func:`call` retries instead,
with tenacity: throttling errors, 5xx answers and connection errors, exponential backoff with full jitter,
bounded attempts ("Error retries and exponential backoff in AWS", AWS General Reference). Anything else —
``ValidationError: No active Lifecycle Action found…``, ``InvalidInstanceID…``, access denied — is raised to
the caller at once, which classifies it (DESIGN.md, rule 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from queue_processor.config import Settings

__all__ = ["AwsClients", "call", "error_code", "is_no_active_action", "is_retryable", "observe_calls"]

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
    """Whether Auto Scaling answered ``ValidationError: No active Lifecycle Action found…``: the action was
    completed, abandoned or timed out already — terminal, never retried."""
    return error_code(exc) == "ValidationError" and "No active Lifecycle Action" in str(exc)


#: Attempts per AWS call, the first included.
ATTEMPTS = 5


_observer: Callable[[str, str, str], None] | None = None


def observe_calls(observer: Callable[[str, str, str], None] | None) -> None:
    """Have every attempt of :func:`call` reported as ``observer(service, operation, result)``: service as
    botocore names it (``sqs``), operation as the API does (``ReceiveMessage``), result ``ok``,
    ``throttled`` or ``error`` (``queue_processor_aws_requests_total``). ``None`` stops the reports."""
    global _observer
    _observer = observer


def _report(fn: Callable[..., Any], exc: BaseException | None) -> None:
    if _observer is None:
        return
    client = getattr(fn, "__self__", None)
    meta = getattr(client, "meta", None)
    service = str(meta.service_model.service_name) if meta is not None else "unknown"
    operation = meta.method_to_api_mapping.get(fn.__name__, fn.__name__) if meta is not None else fn.__name__
    result = "ok" if exc is None else ("throttled" if error_code(exc) in THROTTLING else "error")
    _observer(service, str(operation), result)


async def call(fn: Callable[..., Awaitable[T]], /, **kwargs: Any) -> T:
    """``await fn(**kwargs)``, retried with jittered exponential backoff (up to 0.2 s * 2^n, at most 5 s
    between attempts, :data:`ATTEMPTS` in all) while :func:`is_retryable`; raises the last error, or at once
    a non-retryable one. Each attempt is reported to the :func:`observe_calls` observer."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_retryable),
        wait=wait_random_exponential(multiplier=0.2, max=5),
        stop=stop_after_attempt(ATTEMPTS),
        reraise=True,
    ):
        with attempt:
            try:
                answer = await fn(**kwargs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _report(fn, exc)
                raise
            _report(fn, None)
            return answer
    raise AssertionError("unreachable")  # pragma: no cover


class AwsClients:
    """SQS, EC2 and Auto Scaling clients, opened by ``async with``. ``answered_at`` is the
    ``time.monotonic()`` of the last SQS answer (readiness)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sqs: Any = None
        self.ec2: Any = None
        self.autoscaling: Any = None
        self.answered_at = 0.0
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> AwsClients:
        session = get_session()
        # SQS long polls take 20 s: the read timeout must exceed them.
        config = Config(
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
            max_pool_connections=64,
        )
        options: dict[str, Any] = {"region_name": self.settings.aws_region, "config": config}
        if self.settings.aws_endpoint:
            options["endpoint_url"] = self.settings.aws_endpoint
        self.sqs = await self._stack.enter_async_context(session.create_client("sqs", **options))
        self.ec2 = await self._stack.enter_async_context(session.create_client("ec2", **options))
        self.autoscaling = await self._stack.enter_async_context(
            session.create_client("autoscaling", **options)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def mark_answered(self) -> None:
        """Record that SQS answered now."""
        self.answered_at = time.monotonic()
