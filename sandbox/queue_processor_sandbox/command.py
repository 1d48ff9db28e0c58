"""``queue-processor sandbox``: the embedded AWS and Kubernetes, with a cluster and scenarios.

The controller's CLI finds this command through the entry point group ``queue_processor.commands``
(``sandbox/pyproject.toml``) where this distribution is installed; where it is not, ``queue-processor sandbox``
says in one line how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from queue_processor.parse import parse
from queue_processor_sandbox.control_plane import ControlPlaneError
from queue_processor_sandbox.environment import REAL_ONLY, SCENARIOS, Sandbox, SandboxOptions
from queue_processor_sandbox.run import Progress, as_expected, judge, run_scenario

__all__ = ["default_timeout_s", "sandbox"]


@click.command()
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
    type=click.Choice(sorted(SCENARIOS)),
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
    nodes_drained_twice, evictions_repeated, evictions_denied, last_pods_evicted_early and
    most_draining_at_once (see queue_processor_sandbox.run.judge).
    """
    if scenario in REAL_ONLY and kubernetes != "real":
        raise click.UsageError(
            f"--scenario {scenario} needs --kubernetes real: the emulation serves no Deployments"
        )
    started = time.monotonic()
    console = Console(stderr=True)
    options = SandboxOptions(nodes=nodes, asgs=asgs, scale=scale)
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
