"""The ``queue-processor`` command, with those of the entry point group :data:`COMMANDS` (``sandbox``).
Exit codes: 0 success; 2 a usage error, a bad setting (one line naming it) or a file that cannot be read."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import click
import structlog
from pydantic import SecretStr, ValidationError
from rich.console import Console
from rich.table import Table

from queue_processor import __version__
from queue_processor.app import run_controller
from queue_processor.config import Settings, default
from queue_processor.observe.logs import configure_logging
from queue_processor.outcomes import ConfigError, StartupError
from queue_processor.parse import parse

F = TypeVar("F", bound=Callable[..., Any])


def _flag(name: str) -> str:
    """The flag of the setting ``name`` (``--name/--no-name`` for a switch)."""
    flag = "--" + name.replace("_", "-")
    return f"{flag}/--no-{flag[2:]}" if Settings.model_fields[name].annotation is bool else flag


def notes(field: str) -> dict[str, Any]:
    """What ``config._field`` noted on the Settings field ``field``: ``nth``, ``unit``, ``aliases``, ``secret``."""
    extra = Settings.model_fields[field].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _settings_options(command: F) -> F:
    for name, info in reversed(Settings.model_fields.items()):
        unit = f" ({notes(name)['unit']})" if notes(name)["unit"] else ""
        help_text = f"{info.description}{unit} [env: {name.upper()}]"
        metavar = None if info.annotation is bool else "VALUE"
        command = click.option(_flag(name), name, default=None, metavar=metavar, help=help_text)(command)
    return command


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, ``overrides`` (field name → value) winning. Raises :class:`ConfigError`
    with one line naming each bad variable (its value too, unless a secret)."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        aliases = {alias.lower(): name for name in Settings.model_fields for alias in notes(name)["aliases"]}
        parts = []
        for error in exc.errors(include_url=False):
            message = str(error["msg"]).removeprefix("Value error, ")
            if not error["loc"]:
                parts.append(message)
                continue
            field = aliases.get(str(error["loc"][0]).lower(), str(error["loc"][0]).lower())
            value = given.get(field, error.get("input"))
            secret = field in Settings.model_fields and notes(field)["secret"]
            shown = "" if secret or isinstance(value, dict) else f"={value}"
            parts.append(f"{field.upper()}{shown}: {message}")
        raise ConfigError("; ".join(parts)) from None


def _load(flags: dict[str, Any]) -> Settings:
    """Settings from the environment and the flags; a bad one exits 2 with one line on stderr."""
    try:
        return load_settings(**flags)
    except ConfigError as exc:
        click.echo(f"queue-processor: invalid configuration: {exc}", err=True)
        raise click.exceptions.Exit(2) from None


#: The entry point group whose commands the CLI adds (``queue-processor-sandbox`` registers ``sandbox``).
COMMANDS = "queue_processor.commands"
#: Commands that other distributions of this repository provide, and how to get each where it is missing.
ELSEWHERE = {
    "sandbox": "the sandbox is not installed: from a clone of the repository, `make demo`, or "
    "`pip install -e ./gotemplate -e . -e ./sandbox` (the queue-processor-sandbox distribution in sandbox/)",
}


class _Commands(click.Group):
    """Its commands plus those of :data:`COMMANDS`, imported only when run; one missing (:data:`ELSEWHERE`) or
    that cannot be loaded exits 2 with one line saying why."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_entry_points(), *ELSEWHERE})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        own = super().get_command(ctx, cmd_name)
        if own is not None:
            return own
        found = _entry_points().get(cmd_name)
        if found is not None:
            try:
                loaded = found.load()
                why = "is not a click command"
            except Exception as exc:  # a broken installation: say so in one line, never a traceback
                loaded, why = None, f"cannot be loaded: {exc!r}"
            if isinstance(loaded, click.Command):
                return loaded
            return _missing(cmd_name, f"its entry point {found.value} ({COMMANDS}) {why}")
        if cmd_name in ELSEWHERE:
            return _missing(cmd_name, ELSEWHERE[cmd_name])
        return None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands' list in ``--help``, without loading entry points."""
        points = _entry_points()
        rows = []
        for name in self.list_commands(ctx):
            command = super().get_command(ctx, name)
            if command is not None:
                if not command.hidden:
                    rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
            elif name in points:
                module = points[name].value.split(":")[0]
                rows.append((name, f"See `queue-processor {name} --help` ({module})."))
            else:
                rows.append((name, f"Not installed here: {ELSEWHERE[name]}."))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {point.name: point for point in importlib.metadata.entry_points(group=COMMANDS)}


def _missing(name: str, hint: str) -> click.Command:
    """A command that exits 2 with one line: ``queue-processor NAME: HINT``."""

    def explain(**_: Any) -> None:
        click.echo(f"queue-processor {name}: {hint}", err=True)
        raise click.exceptions.Exit(2)

    return click.Command(
        name,
        callback=explain,
        help=f"Not installed here: {hint}.",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@click.group(
    cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110}
)
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
        structlog.get_logger("queue_processor.cli").warning(line)
    try:
        _run_to_end(settings)
    except StartupError as exc:
        click.echo(f"queue-processor: cannot start: {exc}", err=True)
        _exit_if_threads_linger(2)
        raise click.exceptions.Exit(2) from None
    _exit_if_threads_linger()


def _exit_if_threads_linger(status: int = 0) -> None:
    """Exit now if a worker thread is still busy: interpreter exit would join it past SHUTDOWN_TIMEOUT_SEC."""
    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _run_to_end(settings: Settings) -> None:
    """Run the controller until SIGTERM or SIGINT, then ignore both (a second: -15). Raises :class:`StartupError`."""

    async def run_until_signalled() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await run_controller(settings, stop)

    try:
        asyncio.run(run_until_signalled())
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


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
        name.upper(): ("***" if value.get_secret_value() else "") if isinstance(value, SecretStr) else value
        for name, value in settings.model_dump().items()
    }
    click.echo(json.dumps(shown, indent=2, default=str))


_IMDS_ONLY = "NTH's IMDS mode only: queue-processor reads the queue, every kind of message in it is handled"
#: NTH's variables that mean nothing here, and what replaces them (docs/migration.md, "not needed").
NTH_IGNORED: dict[str, str] = {
    "ENABLE_SQS_TERMINATION_DRAINING": "queue-processor has no other mode",
    "WORKERS": "IN_FLIGHT_BUDGET bounds the messages handled at once and DRAIN_BUDGET the nodes drained at once",
    "LOG_FORMAT_VERSION": "there is one structured log format (JSON_LOGGING)",
    "NODE_NAME": "queue-processor does not depend on the node it runs on",
    "PROBES_SERVER_ENDPOINT": "the probe paths are fixed: /healthz and /readyz",
    "INSTANCE_METADATA_URL": _IMDS_ONLY,
    "METADATA_TRIES": _IMDS_ONLY,
    "UPTIME_FROM_FILE": _IMDS_ONLY,
    "ENABLE_SPOT_INTERRUPTION_DRAINING": _IMDS_ONLY,
    "ENABLE_SCHEDULED_EVENT_DRAINING": _IMDS_ONLY,
    "ENABLE_REBALANCE_MONITORING": _IMDS_ONLY,
    "ENABLE_REBALANCE_DRAINING": _IMDS_ONLY,
    "ENABLE_ASG_LIFECYCLE_DRAINING": _IMDS_ONLY,
}


def nth_settings_ignored(environ: Mapping[str, str]) -> list[str]:
    """One warning line per :data:`NTH_IGNORED` variable set in ``environ``, naming what replaces it."""
    return [
        f"{name} is aws-node-termination-handler's and is ignored: {instead}"
        for name, instead in NTH_IGNORED.items()
        if environ.get(name, "").strip()
    ]


def configuration_markdown() -> str:
    """``docs/configuration.md``: every setting with its variable, CLI flag, default, unit and NTH note."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `queue-processor config --reference`; `make docs` rewrites it and a test fails when",
        "     it is stale. Edit the descriptions in queue_processor/config.py. -->",
        "",
        "Every setting is an environment variable and a command-line flag (`queue-processor config --help` lists",
        "them; a flag wins over the variable). An empty variable counts as unset. Times are in seconds. A bad",
        "value stops start-up with one line naming the variable; `queue-processor config` checks a set of",
        "settings the same way without starting anything. The last column says how each setting relates to",
        "aws-node-termination-handler (NTH).",
        "",
        "| variable | flag | default | unit | description | NTH |",
        "|---|---|---|---|---|---|",
    ]
    for name, info in Settings.model_fields.items():
        extra = notes(name)
        variable = f"`{name.upper()}`" + "".join(f"<br>`{alias}`" for alias in extra["aliases"])
        value = info.default
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, bool):
            shown = str(value).lower()
        elif isinstance(value, dict):
            shown = "`" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "`"
        elif value in ("", []):
            shown = "(none)"
        elif isinstance(value, str) and len(value) > 40:
            shown = "NTH's template"
        else:
            shown = f"`{value}`"
        description = str(info.description).replace("|", "\\|")
        nth = str(extra.get("nth", "same")).replace("|", "\\|")
        flag = f"`--{name.replace('_', '-')}`"
        lines.append(f"| {variable} | {flag} | {shown} | {extra.get('unit', '')} | {description} | {nth} |")
    lines += ANNOTATIONS_MARKDOWN
    return "\n".join(lines)


#: The annotations users set, as docs/configuration.md lists them (after the settings).
ANNOTATIONS_MARKDOWN = [
    "",
    "## Annotations",
    "",
    "Set on a workload's pod template (so every pod of it carries them); nothing is asked of the cluster",
    "otherwise. NTH has none of them.",
    "",
    "| annotation | on | values | what it does |",
    "|---|---|---|---|",
    "| `queue-processor/drain` | pods | `evict` (default), `last`, `surge` | `last`: the pod is evicted in the last "
    "wave, once the node's other pods are gone, whatever its priority and whatever `DRAIN_ORDER` (a log shipper or "
    "an agent that must outlive the pods it serves, without a cluster-wide PriorityClass). `surge` (a "
    "Deployment's pods, with `SURGE_DRAINS=true`): the Deployment is scaled one replica up and the pod is evicted "
    "once the Deployment has one more available replica, then the count is taken back (docs/kinds.md, "
    '"Replacement before eviction"); without `SURGE_DRAINS`, or on a pod that is not a Deployment\'s (a '
    "StatefulSet cannot surge), it is reported once per workload as below and the pod is evicted. Any other value is "
    "reported once per workload and value (a warning log line `unknown drain policy: evicted as by default`, and "
    "with `EMIT_KUBERNETES_EVENTS` a Warning Event `UnknownDrainPolicy` on the first pod) and the pod is evicted "
    "as without the annotation; a drain never fails for it. `queue-processor explain NODE` shows each pod's "
    "policy. |",
    "",
]


def _format_option(default: str, help_text: str) -> Callable[[F], F]:
    choice = click.Choice(["json", "table"] if default == "json" else ["table", "json"])
    return click.option("--format", "output", type=choice, default=default, show_default=True, help=help_text)


@main.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@_format_option("json", "json: one JSON object per file on its own line; table: a table for people.")
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
    for path in paths:
        try:
            body = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            unreadable += 1
            click.echo(f"queue-processor: cannot read {path}: {exc.strerror or exc}", err=True)
            continue
        result = parse(body)
        if output == "json":
            events = [event.model_dump(mode="json", exclude={"message"}) for event in result.events]
            shown = {"outcome": result.outcome, "reason": result.reason, "envelope": result.envelope}
            click.echo(json.dumps({"file": path, **shown, "events": events}))
            continue
        name = Path(path).name if path != "-" else path
        rows: list[tuple[str, ...]] = [
            (e.kind, e.instance_id, e.event_id, e.start_time.isoformat(), "") for e in result.events
        ]
        for row in rows or [("", "", "", "", result.reason or "")]:
            table.add_row(name, result.outcome, *row)
    if output == "table":
        Console().print(table)
    if unreadable:
        raise click.exceptions.Exit(2)


def _setting_option(name: str, help_text: str, **kwargs: Any) -> Callable[[F], F]:
    """A flag for the setting ``name``: its variable (named in the help), its default, its choices."""
    annotation = Settings.model_fields[name].annotation
    if get_origin(annotation) is Literal:
        kwargs["type"] = click.Choice(get_args(annotation))
    help_text = f"{help_text} [env: {name.upper()}]"
    return click.option(
        _flag(name), envvar=name.upper(), default=default(name), show_default=True, help=help_text, **kwargs
    )


@main.command()
@click.argument("node")
@click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    default=None,
    help="kubeconfig to read the cluster with [env: KUBECONFIG; default: in-cluster, else ~/.kube/config].",
)
@_format_option(
    "table", "table: for people; json: one JSON object (node, found, unschedulable, pods, summary)."
)
@_setting_option("drain_order", "Waves or all at once, for the wave column.")
@_setting_option("drain_critical_priority", "spec.priority from which a pod is in the last wave.")
@_setting_option("ignore_daemon_sets", "Leave DaemonSet pods (else they forbid the drain).")
@_setting_option("delete_local_data", "Evict emptyDir pods (else they forbid the drain).")
@_setting_option(
    "pod_termination_grace_period",
    "In seconds, for the grace column; -1: each pod's own.",
    type=click.IntRange(min=-1),
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
    filters, its drain policy (annotation queue-processor/drain: evict, last), its wave and grace period
    (seconds), the PodDisruptionBudgets that select it with their arithmetic
    (currentHealthy, desiredHealthy, disruptionsAllowed, expectedPods, unhealthyPodEvictionPolicy), and the
    API server's answer to a server-side dry-run eviction, as `kubectl drain --dry-run=server` asks it.

    Needs, with your credentials: nodes get, pods list, poddisruptionbudgets list (policy), pods/eviction
    create (dry run: nothing is evicted).

    Exits 0 when nothing blocks a drain now, 1 when an eviction would be refused or the filters forbid the
    drain, 2 when the node is not found or the cluster cannot be read (one line on stderr).
    """
    from queue_processor.drain.explain import explain_node
    from queue_processor.drain.plan import DrainOptions, DrainOrder
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
        _print_explanation(explanation)
    if any(p.blocked or p.verdict == "error" for p in explanation.pods):
        raise click.exceptions.Exit(1)


def _print_explanation(explanation: Any) -> None:
    """``queue-processor explain``'s table: one row per pod, then the summary."""
    table = Table(title=f"{explanation.node}{' (cordoned)' if explanation.unschedulable else ''}")
    columns = (
        "pod",
        "verdict",
        "policy",
        "wave",
        "grace",
        "ready",
        "PodDisruptionBudgets",
        "dry-run eviction",
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    for pod in explanation.pods:
        table.add_row(
            f"{pod.namespace}/{pod.name}",
            pod.verdict if pod.reason == "ok" else f"{pod.verdict}: {pod.reason}",
            pod.policy,
            str(pod.wave or ""),
            f"{pod.grace_s} s" if pod.wave else "",
            "yes" if pod.ready else "no",
            "\n".join(pod.budgets),
            pod.eviction,
        )
    console = Console()
    console.print(table)
    console.print(explanation.summary)


if __name__ == "__main__":  # pragma: no cover
    main()
