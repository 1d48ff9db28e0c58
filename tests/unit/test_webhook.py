"""Webhook notifications over real HTTP to a local aiohttp server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web

from queue_processor.aws import InstanceInfo
from queue_processor.events import SpotInterruptionEvent
from queue_processor.observe.templates import DEFAULT_WEBHOOK_TEMPLATE
from queue_processor.observe.webhook import Webhook, drain_data
from queue_processor_gotemplate import Struct

EVENT = SpotInterruptionEvent(instance_id="i-1", time=datetime(2026, 11, 22, 12, tzinfo=UTC), source_id="e-1")


@pytest.fixture
async def receiver(unused_tcp_port: int) -> AsyncIterator[tuple[str, list[tuple[dict[str, str], str]]]]:
    """A webhook receiver on 127.0.0.1: its base URL (``/hook`` answers 200, other paths 404) and the
    (headers, body) of each POST it got."""
    received: list[tuple[dict[str, str], str]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append((dict(request.headers), await request.text()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        yield f"http://127.0.0.1:{unused_tcp_port}", received
    finally:
        await runner.cleanup()


def data(node: str = "ip-10-0-0-1.ec2.internal") -> Struct:
    info = InstanceInfo("i-1", node, "us-east-1a", "running", instance_type="m5.large")
    return drain_data(EVENT, node_labels={"team": "ops"}, pods=["web-1"], info=info)


async def test_notify_posts_the_default_template(
    receiver: tuple[str, list[tuple[dict[str, str], str]]],
) -> None:
    base, received = receiver
    webhook = Webhook(
        f"{base}/hook",
        headers={"Content-type": "application/json", "X-Team": "ops"},
        template=DEFAULT_WEBHOOK_TEMPLATE,
    )
    await webhook.notify(data())
    broken = Webhook(f"{base}/missing", headers={}, template="{}")
    await broken.notify(data())
    failing = Webhook(
        f"{base}/hook", headers={}, template="{{ .Kind | upper | upper }}{{ .NodeLabels.x | upper }}"
    )
    await failing.notify(data())  # upper of no value fails when executed: logged, counted, nothing sent
    ((headers, body),) = received
    assert headers["X-Team"] == "ops"
    # NTH's default template inserts values as they are: the Description's trailing newline is raw
    assert body == (
        '{"text":"[NTH][Instance Interruption] EventID: spot-itn-event-652d31 - Kind: SPOT_ITN - Instance: i-1 - '
        "Node: ip-10-0-0-1.ec2.internal - Description: Spot Interruption notice for instance i-1 was sent at "
        '2026-11-22 12:00:00 +0000 UTC \n - Start Time: 2026-11-22 12:00:00 +0000 UTC"}'
    )
    assert (webhook.sent, webhook.failures, broken.failures, failing.failures) == (1, 0, 1, 1)


async def test_a_template_file_is_read_for_every_request(
    receiver: tuple[str, list[tuple[dict[str, str], str]]], tmp_path: Path
) -> None:
    """WEBHOOK_TEMPLATE_FILE, as NTH: a mounted ConfigMap that changes changes the next body; a file that
    cannot be read sends nothing."""
    base, received = receiver
    template = tmp_path / "template"
    webhook = Webhook(
        f"{base}/hook", headers={}, template=DEFAULT_WEBHOOK_TEMPLATE, template_file=str(template)
    )
    template.write_text("first {{ .NodeName }}")
    await webhook.notify(data("n1"))
    template.write_text("second {{ .NodeName }}")
    await webhook.notify(data("n2"))
    template.unlink()
    await webhook.notify(data("n3"))
    assert [body for _, body in received] == ["first n1", "second n2"]
    assert (webhook.sent, webhook.failures) == (2, 1)
