"""The ``queue-processor`` command.

- ``run``: the controller;
- ``inspect PATH...``: what the controller would make of message bodies taken from a queue or its DLQ;
- ``explain NODE``: what would block a drain of a node now (PodDisruptionBudgets with their arithmetic);
- ``config``: check the settings from the environment and flags, and print them (secrets masked);
- ``sandbox``: the embedded AWS and Kubernetes, with a cluster and scenarios (needs the ``sandbox`` extra);
- ``version``.

Exit codes: 0 success; 2 a usage error, a bad setting (one line on stderr naming the variable) or a file that
cannot be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from pydantic import SecretStr
from rich.console import Console
from rich.live import Live
from rich.table import Table

from queue_processor import __version__
from queue_processor.app import run_controller
from queue_processor.config import (
    Settings,
    configuration_markdown,
    default,
    env_name,
    load_settings,
    nth_settings_ignored,
)
from queue_processor.kinds import Event
from queue_processor.observe.logs import configure_logging, get_logger
from queue_processor.outcomes import ConfigError, StartupError
from queue_processor.parse import ParseResult, parse

if TYPE_CHECKING:
    from queue_processor.sandbox.environment import Sandbox

F = TypeVar("F", bound=Callable[..., Any])

#: The sandbox's scenarios (queue_processor.sandbox.environment.SCENARIOS, named here so that the CLI loads
#: without the sandbox extra; a test keeps the two equal).
SCENARIO_NAMES = (
    "asg-scale-in",
    "mixed-duplicates",
    "pdb-blocked",
    "poison",
    "spot-critical",
    "spot-storm",
    "warm-pool-launch",
)


def _settings_options(command: F) -> F:
    """Add one ``--flag`` per :class:`Settings` field (``--queue-url`` for QUEUE_URL, ``--dry-run/--no-dry-run``
    for booleans); a flag given on the command line wins over the environment."""
    for name, info in reversed(Settings.model_fields.items()):
        flag = "--" + name.replace("_", "-")
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        unit = f" ({extra['unit']})" if extra.get("unit") else ""
        help_text = f"{info.description}{unit} [env: {env_name(name)}]"
        if info.annotation is bool:
            option = click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=help_text)
        else:
            option = click.option(flag, name, default=None, metavar="VALUE", help=help_text)
        command = option(command)
    return command


def _load(flags: dict[str, Any]) -> Settings:
    """Settings from the environment and the flags; a bad one exits 2 with one line on stderr."""
    values = {}
    for name, value in flags.items():
        if value is None or name not in Settings.model_fields:
            continue
        if Settings.model_fields[name].annotation == dict[str, str]:
            try:
                value = json.loads(value)
            except ValueError:
                raise click.exceptions.Exit(_fail(f"{env_name(name)}: not a JSON object")) from None
        values[name] = value
    try:
        return load_settings(**values)
    except ConfigError as exc:
        raise click.exceptions.Exit(_fail(str(exc))) from None


def _fail(line: str) -> int:
    click.echo(f"queue-processor: invalid configuration: {line}", err=True)
    return 2


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "--version", prog_name="queue-processor")
def main() -> None:
    """Drains Kubernetes nodes gracefully when their EC2 instances go away, from an SQS queue of EC2 and
    Auto Scaling interruption messages (the queue-processor mode of aws-node-termination-handler, rebuilt)."""


@main.command()
def version() -> None:
    """Print the version."""
    click.echo(__version__)


@main.command()
@_settings_options
def run(**flags: Any) -> None:
    """Run the controller: consume the queue(s) and make each affected node leave gracefully.

    Settings come from the environment and these flags (docs/configuration.md). Kubernetes: the in-cluster
    service account, else KUBECONFIG. SIGTERM/SIGINT stop receiving, make every message in flight visible
    again at once, and exit within SHUTDOWN_TIMEOUT_SEC. Exits 2 with one line naming the variable when a
    setting is bad, or when start-up finds one unusable (a kubeconfig that cannot be read, a port in use, a
    queue that does not exist, AWS credentials missing or refused).
    """
    settings = _load(flags)
    configure_logging(settings.log_level, settings.json_logging)
    for line in nth_settings_ignored(os.environ):
        get_logger().warning(line)
    try:
        asyncio.run(_run_until_signalled(settings))
    except StartupError as exc:
        click.echo(f"queue-processor: cannot start: {exc}", err=True)
        _exit_if_threads_linger(2)
        raise click.exceptions.Exit(2) from None
    _exit_if_threads_linger()


def _exit_if_threads_linger(status: int = 0) -> None:
    """Exit at once (status 0, output flushed) when a worker thread is still busy after the shutdown: a
    request stuck on a slow API server must not hold the process past SHUTDOWN_TIMEOUT_SEC, and interpreter
    exit would join every worker thread."""
    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


async def _run_until_signalled(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await run_controller(settings, stop)


@main.command("config")
@click.option("--reference", is_flag=True, help="Print the configuration reference (Markdown) instead.")
@_settings_options
def config_command(reference: bool, **flags: Any) -> None:
    """Check the settings (environment variables and flags) and print them as JSON, secrets masked.

    Exits 2 with one line naming the variable when a setting is missing or invalid, exactly as
    start-up does; writes one warning line on stderr per aws-node-termination-handler variable that means
    nothing here (WORKERS, NODE_NAME...), as start-up logs it.
    """
    if reference:
        click.echo(configuration_markdown(), nl=False)
        return
    settings = _load(flags)
    for line in nth_settings_ignored(os.environ):
        click.echo(f"queue-processor: warning: {line}", err=True)
    shown = {
        env_name(name): ("***" if value.get_secret_value() else "") if isinstance(value, SecretStr) else value
        for name, value in settings.model_dump().items()
    }
    click.echo(json.dumps(shown, indent=2, default=str))


@main.command()
@click.option(
    "--nodes",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Nodes (EC2 instances) in the cluster.",
)
@click.option(
    "--asgs",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Auto Scaling groups the nodes are spread over.",
)
@click.option(
    "--scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Real seconds per simulated second: 0.01 runs a 120 s Spot notice in 1.2 s.",
)
@click.option(
    "--scenario",
    type=click.Choice(sorted(SCENARIO_NAMES)),
    help="Publish this scenario's events once started.",
)
@click.option(
    "--controller/--no-controller",
    default=True,
    show_default=True,
    help="With --scenario: run the controller against the sandbox, show its progress and judge the end.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=None,
    help="With the controller: give up on the scenario after this many real seconds. Default: 30 s plus "
    "1,200 simulated seconds in real time (--scale 1: 1,230 s; 0.05: 90 s), so that the scenarios' drains "
    "and hook timeouts fit at any scale.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".sandbox"),
    show_default=True,
    help="Where the kubeconfig and the env file are written.",
)
@click.option(
    "--kubernetes",
    type=click.Choice(["emulated", "real"]),
    default="emulated",
    show_default=True,
    help="emulated: the sandbox's own API server (no dependencies). real: a real control plane (etcd, "
    "kube-apiserver, kube-controller-manager, kube-scheduler, KWOK) started on 127.0.0.1 from the binaries "
    "`make cluster-bin` builds; the controller then runs as a ServiceAccount with only its RBAC rules.",
)
@click.option(
    "--exit-after",
    type=click.FloatRange(min=0),
    default=None,
    help="Without the controller: stop after this many real seconds (0: publish, report and stop). "
    "Default: serve until Ctrl-C.",
)
def sandbox(
    nodes: int,
    asgs: int,
    scale: float,
    scenario: str | None,
    controller: bool,
    timeout_s: float | None,
    workdir: Path,
    kubernetes: str,
    exit_after: float | None,
) -> None:
    """Start the embedded sandbox: AWS (SQS queue and dead-letter queue, EventBridge rules, Auto Scaling groups
    with lifecycle hooks, on moto's server) and a Kubernetes API server, with a cluster of --nodes nodes.

    Writes WORKDIR/kubeconfig and WORKDIR/sandbox.env (QUEUE_URL, AWS_REGION, AWS_ENDPOINT, fake credentials,
    KUBECONFIG; with --kubernetes real also POD_NAMESPACE, and WORKDIR/admin.kubeconfig for kubectl). With
    --scenario (and the controller, the default), runs the controller in the same process,
    shows its progress, and ends with a summary whose last line is JSON; exits 0 only when the scenario ended
    as expected. Without a scenario or with --no-controller, serves until Ctrl-C, SIGTERM or --exit-after,
    then judges whatever ran against it (a controller in another process, several replicas, or
    aws-node-termination-handler): the last line is JSON with drained, cordoned, evicted,
    lifecycle_completed, lifecycle_timed_out, daemonset_pods_evicted, messages_left, dlq, heartbeats_after_end,
    nodes_drained_twice, evictions_repeated and evictions_denied (see queue_processor.sandbox.run.judge).
    """
    # The sandbox needs the `sandbox` extra (moto): imported here, so `run` works without it.
    from queue_processor.sandbox.environment import Sandbox, SandboxOptions
    from queue_processor.sandbox.run import as_expected

    started = time.monotonic()
    console = Console(stderr=True)
    options = SandboxOptions(nodes=nodes, asgs=asgs, scale=scale)
    from queue_processor.sandbox.control_plane import ControlPlaneError

    try:
        running = Sandbox(options, workdir=workdir, kubernetes="real" if kubernetes == "real" else "emulated")
        running.start()
    except ControlPlaneError as exc:
        raise click.ClickException(f"--kubernetes real: {exc}") from None
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(running.stop)
        env_file = running.env_path
        console.print(
            f"[bold]sandbox up[/] in {time.monotonic() - started:.1f} s: {nodes} nodes, "
            f"{len(running.kube.objects('pods'))} pods, queue {running.env()['QUEUE_URL']}"
        )
        console.print(f"  settings: {env_file}  (kubeconfig: {running.kubeconfig_path})")
        console.print(
            f"  point a controller at it: [cyan]set -a; . {env_file}; set +a; queue-processor run[/]"
        )
        if scenario and controller:
            for key, value in running.env().items():
                os.environ[key] = value
            if timeout_s is None:
                timeout_s = default_timeout_s(scale)
            summary = asyncio.run(_watch_scenario(running, scenario, timeout_s, console))
            ok = as_expected(summary)
            console.print(
                f"scenario [bold]{scenario}[/] ended {'as expected' if ok else '[red]NOT as expected[/]'}"
            )
            click.echo(json.dumps({k: v for k, v in summary.items() if k != "progress"}))
            raise click.exceptions.Exit(0 if ok else 1)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        published_at = time.monotonic()
        done: dict[str, Any] = running.publish(scenario) if scenario else {}
        if scenario:
            console.print(f"  scenario [bold]{scenario}[/]: {done}")
        stop.wait(exit_after)
        summary = _sandbox_summary(running, scenario, nodes, time.monotonic() - started)
        from queue_processor.sandbox.run import judge

        node_names = [instance.private_dns_name for instance in running.instances]
        verdict = judge(running, node_names, published_at)
    table = Table("outcome", "kind", "messages", title="published to the queue")
    for (outcome, kind), count in sorted(summary.pop("_rows").items()):
        table.add_row(outcome, kind, str(count))
    console.print(table)
    verdict.pop("progress")
    messages = summary.pop("published")
    click.echo(json.dumps({**summary, "published": done, "messages_published": messages, **verdict}))


def default_timeout_s(scale: float) -> float:
    """The default ``--timeout`` (real seconds) at ``--scale``: 30 s for start-up and the last settles, plus
    1,200 simulated seconds (the longest scenario's drains and hook timeouts) in real time."""
    return 30.0 + 1200.0 * scale


async def _watch_scenario(
    running: Sandbox, scenario: str, timeout_s: float, console: Console
) -> dict[str, Any]:
    """Run the scenario with the controller under a live progress line."""
    from queue_processor.sandbox.run import Progress, run_scenario

    total = len(running.instances)
    with Live(console=console, refresh_per_second=8, transient=False) as live:

        def show(state: Progress) -> None:
            live.update(
                f"[{state.seconds:6.1f} s] nodes cordoned {state.cordoned}/{total} · pods evicted {state.evicted} · "
                f"lifecycle completed {state.completed}, open {state.open}, timed out {state.timed_out} · "
                f"queue {state.visible} visible, {state.in_flight} in flight · DLQ {state.dlq}"
            )

        summary = await run_scenario(running, scenario, timeout_s=timeout_s, progress=show)
    if not console.is_terminal:  # Live ends its last line without a newline when it is not a terminal
        console.line()
    return summary


def _sandbox_summary(running: Sandbox, scenario: str | None, nodes: int, seconds: float) -> dict[str, Any]:
    rows: Counter[tuple[str, str]] = Counter()
    queue_url = running.env()["QUEUE_URL"]
    published = [m for m in running.aws.published() if any(queue_url.endswith(q) for q in m.queues)]
    for message in published:
        result = parse(message.body)
        kinds = sorted({str(event.kind) for event in result.events}) or [result.reason or ""]
        for kind in kinds:
            rows[(result.outcome, kind[:60])] += 1
    return {
        "_rows": rows,
        "scenario": scenario,
        "nodes": nodes,
        "nodes_left": len(running.kube.objects("nodes")),
        "published": len(published),
        "seconds": round(seconds, 2),
    }


def _result_json(path: str, result: ParseResult[Event]) -> dict[str, Any]:
    return {
        "file": path,
        "outcome": result.outcome,
        "reason": result.reason,
        "envelope": result.envelope,
        "events": [event.model_dump(mode="json", exclude={"message"}) for event in result.events],
    }


def _read(paths: Iterable[str]) -> Iterable[tuple[str, bytes | None, str | None]]:
    for path in paths:
        try:
            if path == "-":
                yield path, sys.stdin.buffer.read(), None
            else:
                with open(path, "rb") as handle:
                    yield path, handle.read(), None
        except OSError as exc:
            yield path, None, exc.strerror or str(exc)


@main.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option(
    "--format",
    "output",
    type=click.Choice(["json", "table"]),
    default="json",
    show_default=True,
    help="json: one JSON object per file on its own line; table: a table for people.",
)
def inspect(paths: tuple[str, ...], output: str) -> None:
    """Show what the controller would make of SQS message bodies: one file per body, '-' for stdin.

    For each file, prints {"file", "outcome": "events"|"skip"|"poison", "reason", "envelope", "events": [...]},
    each event with its kind, instance_id, event_id, time, start_time (ISO 8601) and kind-specific fields.
    Take a body from a queue or its dead-letter queue with e.g.
    `aws sqs receive-message --queue-url URL --query 'Messages[0].Body' --output text > body.json`.

    Exits 0 when every file was read (poison included), 2 when a file could not be read.
    """
    unreadable = 0
    table = Table()
    for column in ("file", "outcome", "kind", "instance", "event ID", "start time", "reason"):
        table.add_column(column, overflow="fold")  # IDs are copied from here: wrap them, never cut them
    for path, body, error in _read(paths):
        if body is None:
            unreadable += 1
            click.echo(f"queue-processor: cannot read {path}: {error}", err=True)
            continue
        result = parse(body)
        if output == "json":
            click.echo(json.dumps(_result_json(path, result)))
            continue
        name = Path(path).name if path != "-" else path
        if not result.events:
            table.add_row(name, result.outcome, "", "", "", "", result.reason or "")
        for event in result.events:
            table.add_row(
                name,
                result.outcome,
                event.kind,
                event.instance_id,
                event.event_id,
                event.start_time.isoformat(),
                "",
            )
    if output == "table":
        Console().print(table)
    if unreadable:
        raise click.exceptions.Exit(2)


@main.command()
@click.argument("node")
@click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    default=None,
    help="kubeconfig to read the cluster with [env: KUBECONFIG; default: in-cluster, else ~/.kube/config].",
)
@click.option(
    "--format",
    "output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table: for people; json: one JSON object (node, found, unschedulable, pods, summary).",
)
@click.option(
    "--drain-order",
    envvar="DRAIN_ORDER",
    type=click.Choice(["waves", "all-at-once"]),
    default=default("drain_order"),
    show_default=True,
    help="DRAIN_ORDER, for the wave column [env: DRAIN_ORDER].",
)
@click.option(
    "--drain-critical-priority",
    envvar="DRAIN_CRITICAL_PRIORITY",
    type=int,
    default=default("drain_critical_priority"),
    show_default=True,
    help="DRAIN_CRITICAL_PRIORITY: spec.priority from which a pod is in the last wave [env].",
)
@click.option(
    "--ignore-daemon-sets/--no-ignore-daemon-sets",
    envvar="IGNORE_DAEMON_SETS",
    default=default("ignore_daemon_sets"),
    show_default=True,
    help="IGNORE_DAEMON_SETS: leave DaemonSet pods (else they forbid the drain) [env].",
)
@click.option(
    "--delete-local-data/--no-delete-local-data",
    envvar="DELETE_LOCAL_DATA",
    default=default("delete_local_data"),
    show_default=True,
    help="DELETE_LOCAL_DATA: evict emptyDir pods (else they forbid the drain) [env].",
)
@click.option(
    "--pod-termination-grace-period",
    envvar="POD_TERMINATION_GRACE_PERIOD",
    type=click.IntRange(min=-1),
    default=default("pod_termination_grace_period"),
    show_default=True,
    help="POD_TERMINATION_GRACE_PERIOD in seconds, for the grace column; -1: each pod's own [env].",
)
def explain(
    node: str,
    kubeconfig: str | None,
    output: str,
    drain_order: str,
    drain_critical_priority: int,
    ignore_daemon_sets: bool,
    delete_local_data: bool,
    pod_termination_grace_period: int,
) -> None:
    """Show what would block a drain of NODE now, changing nothing: each pod's verdict from kubectl drain's
    filters, its wave and grace period (seconds), the PodDisruptionBudgets that select it with their arithmetic
    (currentHealthy, desiredHealthy, disruptionsAllowed, expectedPods, unhealthyPodEvictionPolicy), and the
    API server's answer to a server-side dry-run eviction, as `kubectl drain --dry-run=server` asks it.

    Needs, with your credentials: nodes get, pods list, poddisruptionbudgets list (policy), pods/eviction
    create (dry run: nothing is evicted).

    Exits 0 when nothing blocks a drain now, 1 when an eviction would be refused or the filters forbid the
    drain, 2 when the node is not found or the cluster cannot be read (one line on stderr).
    """
    from queue_processor.drain.explain import explain_node
    from queue_processor.drain.filters import DrainOptions
    from queue_processor.drain.order import DrainOrder
    from queue_processor.kube import KubeClient, load_api_client
    from queue_processor.outcomes import KubeError

    async def read() -> Any:
        kube = KubeClient(load_api_client(kubeconfig), attempts=2)
        try:
            return await explain_node(
                kube,
                node,
                DrainOptions(ignore_daemonsets=ignore_daemon_sets, delete_emptydir_data=delete_local_data),
                order=DrainOrder(drain_order),
                critical_priority=drain_critical_priority,
                grace_override_s=pod_termination_grace_period,
            )
        finally:
            kube.close()

    try:
        explanation = asyncio.run(read())
    except (StartupError, KubeError) as exc:
        click.echo(f"queue-processor explain: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    if not explanation.found:
        click.echo(f"queue-processor explain: {explanation.summary}", err=True)
        raise click.exceptions.Exit(2)
    if output == "json":
        click.echo(json.dumps(explanation.as_json()))
    else:
        table = Table(title=f"{explanation.node}{' (cordoned)' if explanation.unschedulable else ''}")
        for column in (
            "pod",
            "verdict",
            "wave",
            "grace",
            "ready",
            "PodDisruptionBudgets",
            "dry-run eviction",
        ):
            table.add_column(column, overflow="fold")
        for pod in explanation.pods:
            table.add_row(
                f"{pod.namespace}/{pod.name}",
                pod.verdict if pod.reason == "ok" else f"{pod.verdict}: {pod.reason}",
                str(pod.wave or ""),
                f"{pod.grace_s} s" if pod.wave else "",
                "yes" if pod.ready else "no",
                "\n".join(pod.budgets),
                pod.eviction,
            )
        console = Console()
        console.print(table)
        console.print(explanation.summary)
    blocked = any(p.blocked for p in explanation.pods) or any(p.verdict == "error" for p in explanation.pods)
    if blocked:
        raise click.exceptions.Exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
