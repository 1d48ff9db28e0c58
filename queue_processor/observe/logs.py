"""Structured logging: structlog for our code, the standard library's loggers routed through the same output.

Call :func:`configure_logging` once at start-up (``LOG_LEVEL``, ``JSON_LOGGING`` of
:mod:`queue_processor.config`), then log through :func:`get_logger`::

    log = get_logger(message_id=msg.message_id, kind=event.kind)
    log = log.bind(event_id=event.event_id, instance_id=event.instance_id)
    log.info("cordoned", node=node_name, took_s=0.12)

Output goes to standard error (standard output stays free for the CLI's own output), one line per record:

- JSON (``json=True``, production): one object per line, ``{"timestamp": "2024-05-01T12:00:00.123456Z",
  "level": "info", "logger": "queue_processor.handler", "event": "cordoned", "message_id": ..., ...}``:
  ``timestamp`` is ISO 8601 in UTC, ``level`` the lower-case level name, ``event`` the message, then the
  keys of :data:`CONVENTION_KEYS` that are bound, then any other key. An exception is rendered as a
  structured ``exception`` list (structlog's ``ExceptionDictTransformer``, without local variables).
- console (``json=False``): structlog's readable ``ConsoleRenderer`` (colours only on a terminal).

Records of standard-library loggers (aiohttp, botocore, kubernetes, asyncio...) go through the same
renderer, at the same level, with their logger name in ``logger``.

Convention: a line about a message or an event carries, whenever they are known, the keys of
:data:`CONVENTION_KEYS`:

- ``message_id``: the SQS message ID;
- ``event_id``: the event's deterministic ID (:func:`queue_processor.events.make_event_id`);
- ``instance_id``: the EC2 instance ID;
- ``node``: the Kubernetes node name;
- ``kind``: the event kind (:class:`queue_processor.events.EventKind` value).

Bind them (``get_logger(**keys)``, ``log.bind(...)``) or, across calls that do not pass a logger, with
``structlog.contextvars.bound_contextvars(...)``, which every line merges in.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final, TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["CONVENTION_KEYS", "configure_logging", "get_logger"]

#: The keys a log line about a message or an event carries when they are known, in output order.
CONVENTION_KEYS: Final = ("message_id", "event_id", "instance_id", "node", "kind")

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_FIRST_KEYS: Final = ("timestamp", "level", "logger", "event", *CONVENTION_KEYS)
# Marks the root handler this module installs, so that a second configure_logging replaces it.
_HANDLER_MARK: Final = "_queue_processor_handler"


def _order_keys(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Put ``timestamp``, ``level``, ``logger``, ``event`` and the convention keys first, in that order."""
    ordered = {key: event_dict.pop(key) for key in _FIRST_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


def _shared_processors() -> list[Processor]:
    """What every record goes through before rendering, structlog's and the standard library's alike."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.UnicodeDecoder(),
    ]


def configure_logging(level: str, json: bool, *, stream: TextIO | None = None) -> None:
    """Configure structlog and the standard library's ``logging`` to log at ``level`` and up.

    ``level`` is ``debug``, ``info``, ``warning`` or ``error`` (any case; ``LOG_LEVEL``); ``json`` picks
    JSON lines (``JSON_LOGGING=true``) over the console renderer; ``stream`` is where lines go (default:
    ``sys.stderr`` as it is when called). Idempotent: a second call replaces the first's configuration and
    handler, never adds a second handler. Raises ``ValueError`` for an unknown level.
    """
    try:
        numeric = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}: use one of debug, info, warning, error") from None

    renderer: Processor
    if json:
        # Tracebacks as data, without local variables (they may hold secrets and make lines huge).
        tracebacks = structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
        final: list[Processor] = [tracebacks, _order_keys]
        renderer = structlog.processors.JSONRenderer()
    else:
        final = [_order_keys]
        out = stream if stream is not None else sys.stderr
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty(), sort_keys=False)

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final, renderer],
    )
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(ignore_frame_names=[__name__]),
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
        # The chain above is the same for every configuration (rendering happens in the handler), so a
        # logger cached before a reconfiguration still renders with the new handler.
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger named after the calling module, with ``bound`` keys on every line it writes.

    Bind the keys of :data:`CONVENTION_KEYS` (``message_id``, ``event_id``, ``instance_id``, ``node``,
    ``kind``) when they are known. The logger is lazy: it may be created at import time, before
    :func:`configure_logging`, as long as its first line is written after it.
    """
    return structlog.stdlib.get_logger(**bound)
