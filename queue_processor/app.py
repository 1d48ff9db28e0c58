"""The controller assembled: :func:`run_controller` builds the clients and the pipeline, serves, consumes until
asked to stop, then shuts down (stop receiving, EarlyExit for everything in flight, close the clients).
:class:`ProbeServer` serves ``/metrics`` and the kubelet's probes (aiohttp): 200 when every check passes, else 503,
with ``{"status": "ok" | "failing", "checks": {name: bool}, "failing": [name...]}`` (``"errors"``: those raising)."""

from __future__ import annotations

import asyncio
import functools
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog
from aiohttp import web

from queue_processor import __version__, rest
from queue_processor.aws import AwsClients, InstanceResolver, describe_instances, tagged_instances
from queue_processor.config import Settings, parse_annotations
from queue_processor.consumer import Consumer
from queue_processor.drain.drainer import Drainer
from queue_processor.drain.evictions import evictions_in_flight
from queue_processor.drain.plan import DrainOptions, DrainTiming
from queue_processor.events import EventStore
from queue_processor.handler import Handler
from queue_processor.kube import KubeClient, load_api_client
from queue_processor.leases import NodeLeases
from queue_processor.lifecycle import Heartbeats, Lifecycle
from queue_processor.observe.events import NodeEventRecorder
from queue_processor.observe.metrics import Metrics
from queue_processor.observe.webhook import Webhook
from queue_processor.outcomes import StartupError
from queue_processor.rest import AFTER_CORDONS, URGENT_RANK
from queue_processor.returns import Returns
from queue_processor.settlement import Ledger
from queue_processor.watch import Departures, NodeCache, NodeFinder, tagged_nodes

log = structlog.get_logger("queue_processor.app")

Check = Callable[[], bool]
"""A probe check: ``True`` when healthy. Called on the event loop for each request: cheap, never blocking."""

#: Seconds ``stop()`` lets an in-flight request finish.
_SHUTDOWN_TIMEOUT_S: Final = 2.0


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
    ports (0: any free port; ``None``: not served), the bound ones while started; equal ports share one listener.
    ``liveness`` / ``readiness``: the checks of ``/healthz`` and ``/readyz`` by name."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        metrics_port: int | None = 9092,
        probes_port: int | None = 8080,
        host: str = "0.0.0.0",
        liveness: dict[str, Check] | None = None,
        readiness: dict[str, Check] | None = None,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.liveness = liveness if liveness is not None else {}
        self.readiness = readiness if readiness is not None else {}
        self._wanted = (metrics_port, probes_port)
        self.metrics_port, self.probes_port = self._wanted
        self.shared = metrics_port is not None and metrics_port == probes_port
        self._runners: list[web.AppRunner] = []

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        metrics: Metrics,
        liveness: dict[str, Check] | None = None,
        readiness: dict[str, Check] | None = None,
    ) -> ProbeServer:
        """The server of ENABLE_PROMETHEUS_SERVER, ENABLE_PROBES_SERVER and their ports."""
        return cls(
            metrics,
            metrics_port=settings.prometheus_server_port if settings.enable_prometheus_server else None,
            probes_port=settings.probes_server_port if settings.enable_probes_server else None,
            liveness=liveness,
            readiness=readiness,
        )

    async def start(self) -> None:
        """Bind the listeners and serve; ``OSError`` when a port cannot be bound (nothing is left listening)."""
        try:
            if self.shared:
                assert self.metrics_port is not None
                port = await self._listen(self.metrics_port, metrics=True, probes=True)
                self.metrics_port = self.probes_port = port
            else:
                if self.metrics_port is not None:
                    self.metrics_port = await self._listen(self.metrics_port, metrics=True)
                if self.probes_port is not None:
                    self.probes_port = await self._listen(self.probes_port, probes=True)
        except BaseException:
            await self.stop()
            raise
        log.info(
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
        self.metrics_port, self.probes_port = self._wanted

    async def __aenter__(self) -> ProbeServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _listen(self, port: int, *, metrics: bool = False, probes: bool = False) -> int:
        """Serve ``/metrics`` and/or the probes on ``port``; the port bound."""
        app = web.Application()
        if metrics:
            app.router.add_get("/metrics", self._handle_metrics)
        if probes:
            app.router.add_get("/healthz", functools.partial(_probe, self.liveness))
            app.router.add_get("/readyz", functools.partial(_probe, self.readiness))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, self.host, port).start()
        return int(runner.addresses[0][1])

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})


@dataclass
class Controller:
    """The running pieces, built by :func:`_assemble` before anything starts."""

    consumer: Consumer
    handler: Handler
    kube: KubeClient
    drainer: Drainer
    resolver: InstanceResolver
    metrics: Metrics
    departures: Departures
    nodes: NodeCache
    leases: NodeLeases | None
    server: ProbeServer | None = None


async def run_controller(
    settings: Settings,
    stop: asyncio.Event,
    *,
    kubeconfig: str | None = None,
    serve: bool = True,
    started: Callable[[Controller], None] | None = None,
) -> None:
    """Run until ``stop`` is set. ``kubeconfig`` overrides the in-cluster / KUBECONFIG lookup, ``serve`` starts
    the probe and metrics server, ``started`` gets the :class:`Controller` once it consumes. Raises
    :class:`~queue_processor.outcomes.StartupError` when the kubeconfig, a port or SQS is unusable for good."""
    before = asyncio.all_tasks()  # the caller's own (a sandbox running us in its loop): not ours to count
    metrics = Metrics(__version__)
    async with AwsClients(settings, observer=metrics) as aws:
        kube = KubeClient(
            load_api_client(kubeconfig),
            qps=settings.kube_api_qps,
            burst=settings.kube_api_burst,
            observer=metrics,
        )
        controller = _assemble(settings, aws, kube, metrics)
        if serve:
            controller.server = await _serve(settings, metrics, controller.consumer, kube)
        controller.departures.start()
        controller.nodes.start()
        if controller.leases is not None:
            controller.leases.watch.start()
        controller.consumer.start()
        background = _background(settings, aws.ec2, controller)
        log.info("consuming", queues=settings.all_queue_urls, drain_budget=settings.drain_budget)
        if started is not None:
            started(controller)
        stopped = asyncio.ensure_future(stop.wait())
        try:
            waiting: set[asyncio.Future[Any]] = {stopped, controller.consumer.refused}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            await _shut_down(settings, controller, background, before)
        if controller.consumer.refused.done():
            raise StartupError(controller.consumer.refused.result())


def _assemble(settings: Settings, aws: AwsClients, kube: KubeClient, metrics: Metrics) -> Controller:
    """Build the pipeline from the settings (nothing starts here)."""
    resolver = InstanceResolver(functools.partial(describe_instances, aws.ec2))
    departures, nodes = Departures(kube), NodeCache(kube)
    drainer = _drainer(settings, kube, metrics, departures, nodes)
    lifecycle = Lifecycle(aws.autoscaling, settings, observer=metrics)
    heartbeats = Heartbeats(lifecycle, hold_s=settings.sqs_msg_visibility_timeout_sec)
    leases = (
        NodeLeases(
            kube,
            namespace=settings.pod_namespace or "default",
            identity=settings.pod_name or f"{socket.gethostname()}-{os.getpid()}",
            duration_s=settings.node_lease_duration_sec,
        )
        if settings.node_leases
        else None
    )
    handler = Handler(
        settings,
        resolver=resolver,
        finder=NodeFinder(kube, use_provider_id=settings.use_provider_id),
        heartbeats=heartbeats,
        drainer=drainer,
        recorder=NodeEventRecorder(
            kube, annotations=parse_annotations(settings.kubernetes_events_extra_annotations)
        )
        if settings.emit_kubernetes_events
        else None,
        leases=leases,
        webhook=Webhook(
            webhook_url,
            headers=settings.webhook_headers,
            template=settings.webhook_template,
            template_file=settings.webhook_template_file,
            proxy=settings.webhook_proxy,
        )
        if (webhook_url := settings.webhook_url.get_secret_value())
        else None,
        observer=metrics,
    )
    consumer = Consumer(
        Ledger(
            aws.sqs,
            EventStore(),
            heartbeats,
            in_flight_budget=settings.in_flight_budget,
            visibility_timeout_s=settings.sqs_msg_visibility_timeout_sec,
            poison_visibility_s=settings.poison_visibility_timeout_sec,
            requeue_base_s=settings.requeue_backoff_base_sec,
            observer=metrics,
        ),
        handler,
        queue_urls=settings.all_queue_urls,
        loops_per_queue=settings.receive_loops_per_queue,
        wait_s=settings.receive_wait_time_sec,
    )
    return Controller(consumer, handler, kube, drainer, resolver, metrics, departures, nodes, leases)


def _drainer(
    settings: Settings, kube: KubeClient, metrics: Metrics, departures: Departures, nodes: NodeCache
) -> Drainer:
    """The drainer as the settings describe it (kubectl-drain options, budget, grace, timing)."""
    own_pod = (settings.pod_namespace, settings.pod_name) if settings.pod_name else None
    return Drainer(
        kube,
        DrainOptions(
            ignore_daemonsets=settings.ignore_daemon_sets,
            delete_emptydir_data=settings.delete_local_data,
            force=True,
            own_pod=own_pod,
        ),
        budget=settings.drain_budget,
        grace_s=settings.pod_termination_grace_period,
        use_cache=settings.use_apiserver_cache,
        timing=DrainTiming.of(settings),
        observer=metrics,
        departures=departures,
        nodes=nodes,
        evictions_in_flight=settings.evictions_in_flight
        or evictions_in_flight(settings.kube_api_qps, settings.kube_api_burst),
    )


async def _serve(settings: Settings, metrics: Metrics, consumer: Consumer, kube: KubeClient) -> ProbeServer:
    """Start the probe and metrics server. Raises :class:`StartupError` when a port cannot be bound."""
    server = ProbeServer.from_settings(
        settings,
        metrics,
        liveness={"receive-loops": consumer.alive},
        readiness={"sqs": consumer.reachable, "kubernetes": kube.reachable},
    )
    try:
        await server.start()
    except OSError as exc:
        raise StartupError(
            f"PROMETHEUS_SERVER_PORT={settings.prometheus_server_port} / PROBES_SERVER_PORT="
            f"{settings.probes_server_port}: cannot listen: {exc.strerror or exc}"
        ) from None
    return server


def _background(settings: Settings, ec2: Any, controller: Controller) -> list[asyncio.Task[None]]:
    """NTH's tagged gauges (when metrics are served) and the return check (UNCORDON_ON_RETURN, not in dry run)."""
    tasks = []
    if controller.server is not None and settings.enable_prometheus_server:
        gauges = _tagged_gauges(
            ec2, controller.kube, controller.nodes, settings.managed_tag, controller.metrics
        )
        tasks.append(rest.spawn(gauges, name="nth-tagged"))
    if settings.uncordon_on_return and not settings.dry_run:
        returns = Returns(
            controller.kube,
            controller.drainer,
            controller.resolver,
            busy=controller.handler.draining.here,
            leases=controller.leases,
            interval_s=settings.return_check_interval_sec,
            observer=controller.metrics,
            nodes=controller.nodes,
        )
        tasks.append(rest.spawn(returns.run(), name="returns"))
    return tasks


async def _shut_down(
    settings: Settings,
    controller: Controller,
    background: list[asyncio.Task[None]],
    before: set[asyncio.Task[Any]],
) -> None:
    """Stop receiving, EarlyExit for everything in flight, close the clients; log what is left."""
    log.info("stopping: EarlyExit for everything in flight", timeout_s=settings.shutdown_timeout_sec)
    # Bounded whatever AWS or the API server does: a request stuck in a worker thread is abandoned.
    await rest.stop(*background)
    await controller.consumer.shutdown(max(settings.shutdown_timeout_sec - 1.0, 0.1))
    if controller.leases is not None:  # the operations have ended: free what the replica Lease held
        await controller.leases.close()
    await controller.resolver.close()
    await controller.departures.close()
    await controller.nodes.close()
    if controller.server is not None:
        await controller.server.stop()
    controller.kube.close(wait=False)
    left = sorted(
        task.get_name() for task in asyncio.all_tasks() - before if task is not asyncio.current_task()
    )
    log.info(
        "stopped",
        tasks_left=len(left),
        task_names=left[:10],
        operations_left=controller.consumer.tasks,
        heartbeats_left=controller.handler.parts.heartbeats.running,
    )


#: How often NTH's tagged gauges are refreshed (seconds), as NTH (its first refresh comes one period in).
TAGGED_GAUGES_PERIOD_S = 30.0


async def _tagged_gauges(ec2: Any, kube: KubeClient, watched: NodeCache, tag: str, metrics: Metrics) -> None:
    """Refresh NTH's ``nth_tagged_*`` gauges; a failed refresh leaves them as they were, as in NTH."""
    URGENT_RANK.set(AFTER_CORDONS)
    while True:
        await asyncio.sleep(TAGGED_GAUGES_PERIOD_S)
        try:
            instances = await tagged_instances(ec2, tag)
            nodes = watched.all()
            if nodes is None:
                nodes = await kube.list_nodes(cached=True)
        except Exception as exc:  # a refresh must never take the controller down
            log.warning("nth_tagged gauges not refreshed", error=repr(exc))
            continue
        metrics.nth_tagged_instances.set(len(instances))
        metrics.nth_tagged_nodes.set(tagged_nodes(nodes, instances))
