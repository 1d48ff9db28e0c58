"""Webhook notifications (WEBHOOK_URL): one POST per node the controller acts on, NTH-compatible.

The body is WEBHOOK_TEMPLATE with NTH's placeholders replaced: ``{{ .EventID }}``, ``{{ .Kind }}``,
``{{ .InstanceID }}``, ``{{ .NodeName }}``, ``{{ .Description }}``, ``{{ .StartTime }}`` (Go template
functions are not supported); headers are WEBHOOK_HEADERS; WEBHOOK_PROXY is used when set. As NTH does, a
request has 5 seconds and is not retried; a failure is logged and counted, never a reason to fail a drain.
Values are JSON-escaped when the template is JSON (the default template is), so a description with quotes
keeps the body valid.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import structlog

from queue_processor.kinds import Event

__all__ = ["Webhook", "render"]

log = structlog.get_logger("queue_processor.webhook")

_PLACEHOLDER = re.compile(r"\{\{\s*\.(\w+)\s*\}\}")


def render(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``{{ .Name }}`` replaced by ``values[Name]`` (unknown names: empty), the values
    JSON-escaped when the template parses as JSON once filled with plain placeholders."""
    json_like = template.lstrip().startswith(("{", "["))

    def value(match: re.Match[str]) -> str:
        text = values.get(match.group(1), "")
        return json.dumps(text)[1:-1] if json_like else text

    return _PLACEHOLDER.sub(value, template)


class Webhook:
    """Posts notifications to ``url`` (no-op when empty). ``failures`` counts the ones that failed. The body
    is ``template``, or the content of ``template_file`` read again for each request (NTH's
    WEBHOOK_TEMPLATE_FILE: a mounted ConfigMap may change)."""

    def __init__(
        self, url: str, *, headers: dict[str, str], template: str, template_file: str = "", proxy: str = ""
    ) -> None:
        self.url = url
        self.headers = headers
        self.template = template
        self.template_file = template_file
        self.proxy = proxy or None
        self.failures = 0
        self.sent = 0

    async def notify(self, event: Event, node: str, description: str) -> None:
        """POST the rendered template for ``event`` on ``node``."""
        if not self.url:
            return
        template = self.template
        if self.template_file:
            try:
                template = await asyncio.to_thread(Path(self.template_file).read_text, encoding="utf-8")
            except OSError as exc:
                self.failures += 1
                log.warning(
                    "webhook template file unreadable: not sent", file=self.template_file, error=str(exc)
                )
                return
        body = render(
            template,
            {
                "EventID": event.event_id,
                "Kind": str(event.kind),
                "InstanceID": event.instance_id,
                "NodeName": node,
                "Description": description,
                "StartTime": event.start_time.isoformat(),
            },
        )
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(
                    self.url, data=body.encode(), headers=self.headers, proxy=self.proxy
                ) as response,
            ):
                if response.status >= 300:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status, message=response.reason or ""
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failures += 1
            log.warning("webhook failed", node=node, event_id=event.event_id, error=repr(exc))
            return
        self.sent += 1
