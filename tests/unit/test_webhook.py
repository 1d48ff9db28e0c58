"""Webhook notifications over real HTTP to a local aiohttp server."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from queue_processor.config import DEFAULT_WEBHOOK_TEMPLATE
from queue_processor.kinds import SpotInterruptionEvent
from queue_processor.observe.webhook import Webhook, render

EVENT = SpotInterruptionEvent(instance_id="i-1", time=datetime(2026, 11, 22, 12, tzinfo=UTC), source_id="e-1")


def test_render_escapes_values_in_a_json_template() -> None:
    body = render(
        '{"text": "{{ .Description }} on {{.NodeName}} {{ .Unknown }}"}',
        {"Description": 'say "hi"', "NodeName": "n1"},
    )
    assert json.loads(body) == {"text": 'say "hi" on n1 '}
    assert render("plain {{ .Kind }}", {"Kind": "x"}) == "plain x"


async def test_notify_posts_the_default_template(unused_tcp_port: int) -> None:
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
        webhook = Webhook(
            f"http://127.0.0.1:{unused_tcp_port}/hook",
            headers={"Content-type": "application/json", "X-Team": "ops"},
            template=DEFAULT_WEBHOOK_TEMPLATE,
        )
        await webhook.notify(EVENT, "ip-10-0-0-1", "spot-interruption: node cordoned")
        broken = Webhook(f"http://127.0.0.1:{unused_tcp_port}/missing", headers={}, template="{}")
        await broken.notify(EVENT, "n", "d")
    finally:
        await runner.cleanup()
    ((headers, body),) = received
    assert headers["X-Team"] == "ops"
    text = json.loads(body)["text"]
    assert EVENT.event_id in text
    assert "Kind: spot-interruption" in text
    assert "Node: ip-10-0-0-1" in text
    assert "Start Time: 2026-11-22T12:02:00+00:00" in text
    assert (webhook.sent, webhook.failures, broken.failures) == (1, 0, 1)


async def test_a_template_file_is_read_for_every_request(unused_tcp_port: int, tmp_path: Path) -> None:
    """WEBHOOK_TEMPLATE_FILE, as NTH: a mounted ConfigMap that changes changes the next body; a file that
    cannot be read sends nothing."""
    received: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.text())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    template = tmp_path / "template"
    url = f"http://127.0.0.1:{unused_tcp_port}/hook"
    webhook = Webhook(url, headers={}, template=DEFAULT_WEBHOOK_TEMPLATE, template_file=str(template))
    try:
        template.write_text("first {{ .NodeName }}")
        await webhook.notify(EVENT, "n1", "d")
        template.write_text("second {{ .NodeName }}")
        await webhook.notify(EVENT, "n2", "d")
        template.unlink()
        await webhook.notify(EVENT, "n3", "d")
    finally:
        await runner.cleanup()
    assert received == ["first n1", "second n2"]
    assert (webhook.sent, webhook.failures) == (2, 1)
