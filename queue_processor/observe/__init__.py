"""Observability: what the pipeline reports and the Prometheus metrics (:mod:`.metrics`), structured logs
(:mod:`.logs`), Kubernetes Events (:mod:`.events`) and the webhook (:mod:`.webhook`).

The HTTP endpoints that expose metrics and probes (``/metrics``, ``/healthz``, ``/readyz``) are in
:mod:`queue_processor.server`. This package imports nothing itself.
"""
