"""HTTP endpoints for the kubelet and Prometheus (aiohttp): ``/healthz``, ``/readyz`` and ``/metrics``.

A probe answers 200 when every check passes, else 503, with the JSON body ``{"status": "ok" | "failing",
"checks": {name: bool}, "failing": [name...]}`` (plus ``"errors"`` for checks that raised). A failing liveness
probe restarts the container: a liveness check must fail only when a restart would help.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import structlog
from aiohttp import web

from queue_processor.observe.metrics import Metrics

if TYPE_CHECKING:
    from queue_processor.config import Settings

__all__ = ["Check", "ProbeServer"]

Check = Callable[[], bool]
"""A probe check: ``True`` when healthy. Called on the event loop for each request: cheap, never blocking."""

#: Seconds ``stop()`` lets an in-flight request finish before its connection is closed.
_SHUTDOWN_TIMEOUT_S: Final = 2.0

_log = structlog.get_logger("queue_processor.server")


async def _probe(checks: dict[str, Check], request: web.Request) -> web.Response:
    """Run ``checks`` (every one, even after a failure): 200 when all pass, else 503, with the JSON body."""
    results: dict[str, bool] = {}
    errors: dict[str, str] = {}
    for name, check in checks.items():
        try:
            results[name] = bool(check())
        except Exception as exc:  # a broken check fails its probe; it must not fail the request
            results[name] = False
            errors[name] = f"{type(exc).__name__}: {exc}"
    failing = [name for name, ok in results.items() if not ok]
    body: dict[str, Any] = {"status": "failing" if failing else "ok", "checks": results, "failing": failing}
    if errors:
        body["errors"] = errors
    return web.json_response(body, status=503 if failing else 200)


class ProbeServer:
    """The HTTP server (:meth:`start`, :meth:`stop` or ``async with``). ``metrics_port`` / ``probes_port``: TCP
    ports (0: any free port; ``None``: not served). ``shared``: one listener (``None``: when the ports are equal).
    Raises ``ValueError`` for ``shared=True`` with two ports, or ``shared=False`` with one non-zero port twice."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        metrics_port: int | None = 9092,
        probes_port: int | None = 8080,
        host: str = "0.0.0.0",
        shared: bool | None = None,
    ) -> None:
        both = metrics_port is not None and probes_port is not None
        if shared is None:
            shared = both and metrics_port == probes_port
        elif shared and both and metrics_port != probes_port:
            raise ValueError(f"shared=True but the ports differ: {metrics_port} and {probes_port}")
        elif not shared and both and metrics_port == probes_port and metrics_port != 0:
            raise ValueError(f"shared=False but both servers would bind port {metrics_port}")
        self.metrics = metrics
        self.host = host
        self.shared = shared and both  # metrics and probes on one listener
        self._wanted: dict[str, int | None] = {"metrics": metrics_port, "probes": probes_port}
        self._bound: dict[str, int] = {}
        self._liveness: dict[str, Check] = {}
        self._readiness: dict[str, Check] = {}
        self._runners: list[web.AppRunner] = []
        self._started = False

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics) -> ProbeServer:
        """The server ``settings`` ask for (ENABLE_PROMETHEUS_SERVER, ENABLE_PROBES_SERVER and their ports)."""
        return cls(
            metrics,
            metrics_port=settings.prometheus_server_port if settings.enable_prometheus_server else None,
            probes_port=settings.probes_server_port if settings.enable_probes_server else None,
        )

    def add_liveness(self, name: str, fn: Check) -> None:
        """Make ``/healthz`` fail while ``fn()`` is false or raises. Raises ``ValueError`` for a known ``name``."""
        self._add(self._liveness, name, fn)

    def add_readiness(self, name: str, fn: Check) -> None:
        """Make ``/readyz`` fail while ``fn()`` is false or raises. Raises ``ValueError`` for a known ``name``."""
        self._add(self._readiness, name, fn)

    @staticmethod
    def _add(checks: dict[str, Check], name: str, fn: Check) -> None:
        if name in checks:
            raise ValueError(f"check {name!r} is registered already")
        checks[name] = fn

    @property
    def metrics_port(self) -> int | None:
        """The port of ``/metrics``: the bound one once started, else the one asked for; ``None``: not served."""
        return self._port("metrics")

    @property
    def probes_port(self) -> int | None:
        """The port of the probes, as :attr:`metrics_port`."""
        return self._port("probes")

    def _port(self, which: str) -> int | None:
        if self._wanted[which] is None:
            return None
        return self._bound.get(which, self._wanted[which])

    async def start(self) -> None:
        """Bind the listeners and serve. Raises ``OSError`` when a port cannot be bound (nothing is left
        listening) and ``RuntimeError`` when started already."""
        if self._started:
            raise RuntimeError("ProbeServer is started already")
        self._started = True
        metrics_port, probes_port = self._wanted["metrics"], self._wanted["probes"]
        try:
            if self.shared:
                assert metrics_port is not None
                port = await self._listen(self._app(metrics=True, probes=True), metrics_port)
                self._bound = {"metrics": port, "probes": port}
            else:
                if metrics_port is not None:
                    self._bound["metrics"] = await self._listen(self._app(metrics=True), metrics_port)
                if probes_port is not None:
                    self._bound["probes"] = await self._listen(self._app(probes=True), probes_port)
        except BaseException:
            await self.stop()
            raise
        _log.info(
            "probe server listening",
            host=self.host,
            metrics_port=self.metrics_port,
            probes_port=self.probes_port,
        )

    async def stop(self) -> None:
        """Stop serving and close the listeners. Idempotent; the server can be started again after it."""
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        self._bound = {}
        self._started = False

    async def __aenter__(self) -> ProbeServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _app(self, *, metrics: bool = False, probes: bool = False) -> web.Application:
        app = web.Application()
        if metrics:
            app.router.add_get("/metrics", self._handle_metrics)
        if probes:
            app.router.add_get("/healthz", functools.partial(_probe, self._liveness))
            app.router.add_get("/readyz", functools.partial(_probe, self._readiness))
        return app

    async def _listen(self, app: web.Application, port: int) -> int:
        # No access log: the kubelet and Prometheus would fill the log with probe and scrape lines.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, self.host, port).start()
        address = runner.addresses[0]
        return int(address[1])

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})
