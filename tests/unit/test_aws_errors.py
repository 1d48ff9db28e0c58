"""How AWS errors are classified ("Error retries and exponential backoff in AWS", AWS SDK reference guide):
throttling codes and 5xx answers are retried, a client error is not, and "No active Lifecycle Action" is
terminal."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from queue_processor.aws import is_no_active_action, is_retryable


def answer(code: str, status: int, message: str = "") -> ClientError:
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "RecordLifecycleActionHeartbeat")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (answer("Throttling", 400, "Rate exceeded"), True),
        (answer("RequestLimitExceeded", 400), True),
        (answer("InternalFailure", 500), True),
        (answer("ServiceUnavailable", 503), True),
        (answer("ValidationError", 400, "No active Lifecycle Action found with token t"), False),
        (answer("AccessDenied", 403), False),
        (EndpointConnectionError(endpoint_url="https://autoscaling.us-east-1.amazonaws.com"), True),
    ],
)
def test_throttling_5xx_and_no_answer_are_retried_client_errors_are_not(
    error: Exception, retryable: bool
) -> None:
    assert is_retryable(error) is retryable


def test_no_active_lifecycle_action_is_recognised() -> None:
    assert is_no_active_action(
        answer("ValidationError", 400, "No active Lifecycle Action found with token t")
    )
    assert not is_no_active_action(answer("ValidationError", 400, "LifecycleActionResult must be CONTINUE"))
