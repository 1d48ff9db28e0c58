"""Observability: Prometheus metrics (:mod:`.metrics`) and structured logs (:mod:`.logs`).

The HTTP endpoints that expose them (``/metrics``, ``/healthz``, ``/readyz``) are in
:mod:`queue_processor.server`.
"""

from queue_processor.observe.logs import CONVENTION_KEYS, configure_logging, get_logger
from queue_processor.observe.metrics import Metrics, poison_class, skip_class

__all__ = ["CONVENTION_KEYS", "Metrics", "configure_logging", "get_logger", "poison_class", "skip_class"]
