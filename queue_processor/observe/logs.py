"""Structured logging to standard error: structlog, and the standard library's loggers through the same renderer.
JSON lines hold ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``event``, the :data:`CONVENTION_KEYS` that
are bound (bind them when known), then the other keys; an exception is a structured ``exception`` list."""

from __future__ import annotations

import logging
import sys
from typing import Final, TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor, WrappedLogger

#: SQS message ID, event ID (:func:`~queue_processor.events.make_event_id`), EC2 instance ID, node name, kind.
CONVENTION_KEYS: Final = ("message_id", "event_id", "instance_id", "node", "kind")

_FIRST_KEYS: Final = ("timestamp", "level", "logger", "event", *CONVENTION_KEYS)
# Marks the root handler this module installs, so that a second configure_logging replaces it.
_HANDLER_MARK: Final = "_queue_processor_handler"


def _order_keys(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    ordered = {key: event_dict.pop(key) for key in _FIRST_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


def _shared_processors() -> list[Processor]:
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
    """Log at ``level`` (LOG_LEVEL) and up, as JSON lines when ``json``, to ``stream`` (default: stderr); a
    second call replaces the first's handler. Raises ``ValueError`` for an unknown level."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}: use one of debug, info, warning, error")

    out = stream if stream is not None else sys.stderr
    if json:
        # Tracebacks as data, without local variables (they may hold secrets and make lines huge).
        tracebacks = structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
        final: list[Processor] = [tracebacks, _order_keys, structlog.processors.JSONRenderer()]
    else:
        final = [_order_keys, structlog.dev.ConsoleRenderer(colors=out.isatty(), sort_keys=False)]

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = logging.StreamHandler(out)
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
        # Safe: the chain never changes (the handler renders), so a cached logger follows a reconfiguration.
        cache_logger_on_first_use=True,
    )
