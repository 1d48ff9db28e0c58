"""Observability: what the pipeline reports (:mod:`.observer`), Prometheus metrics (:mod:`.metrics`),
structured logs (:mod:`.logs`), Kubernetes Events (:mod:`.events`) and the webhook (:mod:`.webhook`).

The HTTP endpoints that expose metrics and probes (``/metrics``, ``/healthz``, ``/readyz``) are in
:mod:`queue_processor.server`. This package imports nothing itself: the pipeline's modules import
:mod:`.observer`, a leaf, without pulling in Prometheus.
"""
