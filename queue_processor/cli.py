"""The ``queue-processor`` command.

- ``inspect PATH...``: what the controller would make of message bodies taken from a queue or its DLQ;
- ``config``: check the settings from the environment and flags, and print them (secrets masked);
- ``version``.

Exit codes: 0 success; 2 a usage error, a bad setting (one line on stderr naming the variable) or a file that
cannot be read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from queue_processor import __version__
from queue_processor.config import ConfigError, Settings, configuration_markdown, env_name, load_settings
from queue_processor.parse import ParseResult, parse

F = TypeVar("F", bound=Callable[..., Any])


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


@main.command("config")
@click.option("--reference", is_flag=True, help="Print the configuration reference (Markdown) instead.")
@_settings_options
def config_command(reference: bool, **flags: Any) -> None:
    """Check the settings (environment variables and flags) and print them as JSON, secrets masked.

    Exits 2 with one line naming the variable when a setting is missing or invalid, exactly as
    start-up does.
    """
    if reference:
        click.echo(configuration_markdown(), nl=False)
        return
    settings = _load(flags)
    shown = {
        env_name(name): ("***" if value.get_secret_value() else "") if isinstance(value, SecretStr) else value
        for name, value in settings.model_dump().items()
    }
    click.echo(json.dumps(shown, indent=2, default=str))


def _result_json(path: str, result: ParseResult) -> dict[str, Any]:
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


if __name__ == "__main__":  # pragma: no cover
    main()
