"""Webhook notifications over real HTTP to a local aiohttp server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web

from queue_processor.config import DEFAULT_WEBHOOK_TEMPLATE
from queue_processor.kinds import SpotInterruptionEvent
from queue_processor.observe.webhook import Webhook, render

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


def test_render_escapes_values_in_a_json_template() -> None:
    body = render(
        '{"text": "{{ .Description }} on {{.NodeName}} {{ .Unknown }}"}',
        {"Description": 'say "hi"', "NodeName": "n1"},
    )
    assert json.loads(body) == {"text": 'say "hi" on n1 '}
    assert render("plain {{ .Kind }}", {"Kind": "x"}) == "plain x"


async def test_notify_posts_the_default_template(
    receiver: tuple[str, list[tuple[dict[str, str], str]]],
) -> None:
    base, received = receiver
    webhook = Webhook(
        f"{base}/hook",
        headers={"Content-type": "application/json", "X-Team": "ops"},
        template=DEFAULT_WEBHOOK_TEMPLATE,
    )
    await webhook.notify(EVENT, "ip-10-0-0-1", "spot-interruption: node cordoned")
    broken = Webhook(f"{base}/missing", headers={}, template="{}")
    await broken.notify(EVENT, "n", "d")
    ((headers, body),) = received
    assert headers["X-Team"] == "ops"
    text = json.loads(body)["text"]
    assert EVENT.event_id in text
    assert "Kind: spot-interruption" in text
    assert "Node: ip-10-0-0-1" in text
    assert "Start Time: 2026-11-22T12:02:00+00:00" in text
    assert (webhook.sent, webhook.failures, broken.failures) == (1, 0, 1)


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
    await webhook.notify(EVENT, "n1", "d")
    template.write_text("second {{ .NodeName }}")
    await webhook.notify(EVENT, "n2", "d")
    template.unlink()
    await webhook.notify(EVENT, "n3", "d")
    assert [body for _, body in received] == ["first n1", "second n2"]
    assert (webhook.sent, webhook.failures) == (2, 1)
